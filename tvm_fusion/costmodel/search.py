"""Schedules chosen by the cost model alone, for kernels the budget did not reach.

A kernel with no verified record would otherwise run as plain unscheduled loops. Here
MetaSchedule's evolutionary search runs with the cost model as its only judge (nothing
is measured by the search), the candidates are ranked by the model, and the best ones
are checked against the unscheduled kernel on random inputs, in order, until one is
correct and faster than the default; that one is committed, marked as predicted in the
manifest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
from tvm.s_tir import meta_schedule as ms

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PredictedPick:
    """What the cost model chose for one unmeasured kernel."""

    task: str
    accepted: bool        # a candidate passed verification and was committed
    tried: int            # candidates verified
    candidates: int       # candidates the search produced and the model ranked
    us: float | None      # the committed candidate's time, from the verification run
    default_us: float | None
    note: str


def rank_candidates(mod: tvm.IRModule, target: tvm.target.Target, cost_model, *,
                    task_name: str = "main", space_generator="post-order-apply",
                    population: int = 128, count: int = 32, seed: int = 0) -> list:
    """Candidates of ``mod`` from a cost-model-only evolutionary search, best first.

    Returns a list of ``(score, MeasureCandidate)``, highest predicted score first.
    """
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(population, 64),
        genetic_num_iters=2, eps_greedy=0.0)
    # cloned, as MetaSchedule does per task: a space generator is bound to one context
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=space_generator,
                         search_strategy=strategy, task_name=task_name, num_threads=1,
                         rand_state=seed).clone()
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    ctx.pre_tuning(max_trials=count, num_trials_per_iter=count,
                   design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=cost_model)
    try:
        cands = list(ctx.generate_measure_candidates() or [])
    finally:
        ctx.post_tuning()
    if not cands:
        return []
    scores = cost_model.scores(ctx, cands)
    return sorted(zip(scores.tolist(), cands), key=lambda x: -x[0])


def schedule_unmeasured(state, cost_model, target: tvm.target.Target, *, tries: int = 3,
                        seed: int = 0, space_generator="post-order-apply"
                        ) -> list[PredictedPick]:
    """Give every task of a tuning run that has no verified record the model's best pick.

    ``state`` is the driver's tuning state (tasks, best latencies, verifier, databases,
    manifest entry). A committed pick is recorded in the manifest entry under
    ``"predicted"`` with its verification timing. ``space_generator`` is the design
    space the run tuned in.
    """
    from ..tune.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()  # before TuneContext does it the slow way
    picks = []
    for i, task in enumerate(state.tasks):
        if state.best[i] is not None:
            continue
        mod = task.dispatched[0]
        try:
            ranked = rank_candidates(mod, target, cost_model, task_name=task.task_name,
                                     space_generator=space_generator, seed=seed + i)
        except Exception as e:  # a design space MetaSchedule cannot generate: keep the default
            picks.append(PredictedPick(task=task.task_name, accepted=False, tried=0,
                                       candidates=0, us=None, default_us=None,
                                       note=f"search failed: {str(e).splitlines()[0][:200]}"))
            continue
        pick = PredictedPick(task=task.task_name, accepted=False, tried=0,
                             candidates=len(ranked), us=None, default_us=None,
                             note="no candidate")
        for n, (score, cand) in enumerate(ranked[:tries], start=1):
            verdict = state.verifier.check(i, mod, cand.sch.mod)
            pick = PredictedPick(task=task.task_name, accepted=verdict.accepted, tried=n,
                                 candidates=len(ranked), us=verdict.candidate_us,
                                 default_us=verdict.default_us,
                                 note=verdict.error or ("" if verdict.accepted else
                                                        "correct but not faster than default"))
            if not verdict.accepted:
                continue
            state.accepted.commit_tuning_record(ms.database.TuningRecord(
                trace=cand.sch.trace, workload=state.workloads[i],
                run_secs=[verdict.candidate_us / 1e6], target=target,
                args_info=cand.args_info))
            state.best[i] = verdict.candidate_us
            state.entry.setdefault("predicted", {})[task.task_name] = {
                "score": score, "rank": n, "verify_us": verdict.candidate_us,
                "default_us": verdict.default_us, "candidates": len(ranked)}
            break
        picks.append(pick)
    return picks
