"""Concrete schedules drawn from MetaSchedule's design space of one kernel, no measurement.

What a search does before it measures: generate the design space (post-order-apply with
the target's schedule rules), draw random decisions for each sketch, run the
postprocessors (MetaSchedule's own, which include ``VerifyGPUCode``, plus any extra,
e.g. :func:`~tvm_fusion.gpu.limits.resource_check_postproc`). A candidate that a
postprocessor rejects never reaches a builder. Used by the tests and usable for
cost-model-only picking on machines without the GPU.
"""

from __future__ import annotations

import logging

import tvm


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
    from tvm.s_tir import meta_schedule as ms

    from ..tune.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    ctx = ms.TuneContext(mod=mod, target=hw.tvm_target(), space_generator="post-order-apply",
                         search_strategy="evolutionary", task_name="sample", rand_state=seed)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
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
