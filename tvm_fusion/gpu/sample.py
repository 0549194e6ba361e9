"""Concrete schedules drawn from MetaSchedule's design space of one kernel, no measurement.

What a search does before it measures: generate the design space (post-order-apply with
the target's schedule rules), draw random decisions for each sketch, run the
postprocessors (MetaSchedule's own, which include ``VerifyGPUCode``, plus any extra,
e.g. :func:`~tvm_fusion.gpu.check.resource_check_postproc`). A candidate that a
postprocessor rejects never reaches a builder. Used by the tests and usable for
cost-model-only picking on machines without the GPU.
"""

from __future__ import annotations

import logging

import tvm
from tvm.s_tir import meta_schedule as ms

from ..compat.fast_import import import_tensor_intrinsics


def _context(func, hw, seed):
    import_tensor_intrinsics()
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    ctx = ms.TuneContext(mod=mod, target=hw.tvm_target(), space_generator="post-order-apply",
                         search_strategy="evolutionary", task_name="sample", rand_state=seed)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    return ctx


def sample_schedules(func: tvm.tirx.PrimFunc, hw, *, count: int = 4, seed: int = 0,
                     extra_postprocs=(), max_draws: int = 64) -> list:
    """Draw up to ``count`` schedules of ``func`` for ``hw`` that pass every postprocessor.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        An unscheduled kernel (one fused group).
    hw : HardwareTarget
    count : int
        Schedules wanted.
    seed : int
        Seed of the random decisions (the same seed gives the same schedules).
    extra_postprocs : sequence of Postproc
        Run after MetaSchedule's own; a ``False`` from any rejects the draw.
    max_draws : int
        Give up after this many draws.

    Returns
    -------
    list of tvm.s_tir.Schedule
    """
    return _draw(_context(func, hw, seed), count=count, seed=seed,
                 extra_postprocs=extra_postprocs, max_draws=max_draws)


def _draw(ctx, *, count, seed, extra_postprocs, max_draws) -> list:
    mod = ctx.mod
    sketches = ctx.space_generator.generate_design_space(mod)
    postprocs = list(ctx.space_generator.postprocs) + list(extra_postprocs)
    out = []
    for draw in range(max_draws):
        sketch = sketches[draw % len(sketches)]
        # replay the sketch without its decisions: every sampling instruction draws anew
        trace = tvm.s_tir.schedule.Trace(sketch.trace.simplified(remove_postproc=True).insts, {})
        sch = tvm.s_tir.Schedule(mod, seed=seed * 1000 + draw + 1)
        try:
            trace.apply_to_schedule(sch, remove_postproc=True)
        except tvm.error.TVMError:  # a draw the sketch cannot take (e.g. a bad split)
            continue
        if all(p.apply(sch) for p in postprocs):
            out.append(sch)
            if len(out) == count:
                break
    return out


def predict_best(func: tvm.tirx.PrimFunc, hw, cost_model, *, count: int = 16, seed: int = 0,
                 extra_postprocs=()):
    """Pick a schedule of ``func`` for ``hw`` by a cost model's prediction alone.

    For hardware the tuning machine does not have: draw ``count`` verified candidates
    (:func:`sample_schedules`), score them with ``cost_model.predict`` (MetaSchedule's
    convention: higher is better), keep the best. Nothing is built or measured; a
    record made from the result must be marked predicted, not measured.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
    hw : HardwareTarget
    cost_model : tvm.s_tir.meta_schedule.CostModel
        Any MetaSchedule cost model (a trained XGBModel, a PyCostModel...).
    count, seed, extra_postprocs :
        As in :func:`sample_schedules`.

    Returns
    -------
    (tvm.s_tir.Schedule, float, list of float) or None
        The best schedule, its score, and every candidate's score in draw order;
        None when no candidate passed the postprocessors.
    """
    ctx = _context(func, hw, seed)
    schs = _draw(ctx, count=count, seed=seed, extra_postprocs=extra_postprocs, max_draws=4 * count)
    if not schs:
        return None
    cands = [ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, True))
             for sch in schs]
    scores = [float(v) for v in cost_model.predict(ctx, cands)]
    best = max(range(len(scores)), key=scores.__getitem__)
    return schs[best], scores[best], scores
