"""Schedules chosen by the cost model alone: for kernels the budget did not reach, and
for hardware the tuning machine does not have (``tune --dry-run``).

A kernel with no verified record would otherwise run as plain unscheduled loops. Here
MetaSchedule's evolutionary search runs with the cost model as its only judge (nothing
is measured by the search) and the candidates are ranked by the model. Then, best
first:

- where the target's device is on this machine, each is checked against the
  unscheduled kernel on random inputs until one is correct and faster than the
  default; that one is committed with its verification timing;
- where it is not (a GPU target on a machine without that GPU), each is built for the
  target and checked against its limits (threads, shared memory / LDS, vector widths
  in TIR; registers and spills from nvcc's ptxas report for CUDA) until one passes; that
  one is committed with :data:`PREDICTED_RUN_S` as its time, so that any measured record
  of the kernel ranks above it in every reader of the database, stock TVM included.

Either way the manifest marks the kernel ``predicted``, with ``measured`` and
``verified`` saying which of the two it was; a candidate found wrong is written to
``rejected.jsonl`` with its reason (through ``TuneState.settle``, as tuning's own are).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
from tvm.s_tir import meta_schedule as ms

from ..errors import TvmFusionError
from ..family import CODE_OBJECT, PTXAS, strategy
from ..gpu.amdgpu import find_toolchain
from ..gpu.check import check_schedule
from ..compat.fast_import import import_tensor_intrinsics
from ..logs.logdb import PREDICTED_RUN_S
from .state import TuneState
from .verify import Outcome, Verdict

log = logging.getLogger(__name__)

@dataclass(frozen=True, kw_only=True)
class PredictedPick:
    """What the cost model chose for one unmeasured kernel."""

    task: str
    outcome: Outcome | None  # of the last candidate checked (None: none was)
    tried: int            # candidates verified
    candidates: int       # candidates the search produced and the model ranked
    us: float | None      # the committed candidate's time, from the verification run
    default_us: float | None
    note: str
    measured: bool = True  # timed on the device (in verification); False: device absent

    @property
    def accepted(self) -> bool:
        """A candidate passed its check and was committed."""
        return self.outcome is Outcome.ACCEPTED


def rank_candidates(mod: tvm.IRModule, target: tvm.target.Target, cost_model, *,
                    task_name: str = "main", space_generator="post-order-apply",
                    population: int = 128, count: int = 32, seed: int = 0,
                    num_threads: int = 1) -> list:
    """Candidates of ``mod`` from a cost-model-only evolutionary search, best first.

    Returns a list of ``(score, MeasureCandidate)``, highest predicted score first.
    """
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(population, 64),
        genetic_num_iters=2, eps_greedy=0.0)
    # cloned, as MetaSchedule does per task: a space generator is bound to one context
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=space_generator,
                         search_strategy=strategy, task_name=task_name, num_threads=num_threads,
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


def _offline_check(hw, mod: tvm.IRModule, target: tvm.target.Target) -> str | None:
    """Why ``mod`` (a scheduled kernel) cannot run on ``hw``, checked without the device."""
    try:
        if strategy(hw).checks_kernel_limits:
            bad = check_schedule(mod["main"], hw)
            return "; ".join(bad) if bad else None
        tvm.tirx.build(mod, target=target)  # a CPU measured elsewhere: it must build
    except (TvmFusionError, tvm.error.TVMError) as e:
        return f"does not build: {str(e).strip().splitlines()[-1][:300]}"
    return None


def _check_kind(hw) -> str:
    compiler = strategy(hw).resource_compiler
    if compiler == CODE_OBJECT:  # the code object's registers where the toolchain is here
        return "tir" if find_toolchain().missing else "tir+amdgpu"
    return "tir+nvcc" if compiler == PTXAS else "build"


def schedule_unmeasured(state: TuneState, cost_model, target: tvm.target.Target, *, tries: int = 3,
                        seed: int = 0, space_generator="post-order-apply",
                        hw=None, on_device: bool = True) -> list[PredictedPick]:
    """Give every task of a tuning run that has no verified record the model's best pick.

    Parameters
    ----------
    state : tvm_fusion.tune.state.TuneState
        The run's tuning state: its tasks, best latencies and verifier; each pick is
        committed or rejected through its ``settle``.
    cost_model : MetaSchedule cost model
        Its ``scores`` rank the candidates (higher is better).
    target : tvm.target.Target
    tries : int
        Most candidates checked per kernel, best predicted first.
    seed : int
    space_generator :
        The design space the run tuned in.
    hw : HardwareTarget, optional
        Needed when ``on_device`` is False (its limits are checked).
    on_device : bool
        Whether ``target``'s device is on this machine: verify and time each pick here.
        False: check it builds within ``hw``'s limits; nothing is run.

    Returns
    -------
    list of PredictedPick
        One per kernel that had no record, accepted or not, with the reason.
    """
    import_tensor_intrinsics()  # before TuneContext does it the slow way
    predicted = state.entry.setdefault("predicted", {})
    # kernels whose picks were all correct but no faster than the default loops (tiny
    # elementwise kernels, mostly): a later budget step of the same log skips them, which
    # saved re-searching ~30 kernels per step on PP-OCR cls
    slow = state.entry.setdefault("predicted_no_gain", {})
    picks = []
    todo = [i for i, task in enumerate(state.tasks)
            if state.best[i] is None and task.task_name not in slow]
    for k, i in enumerate(todo, start=1):
        task = state.tasks[i]
        if state.progress is not None:
            state.progress.note(f"cost-model picks for kernels without a record: {k}/{len(todo)}"
                                f" {task.task_name[:60]}")
        mod = task.dispatched[0]
        try:
            ranked = rank_candidates(mod, target, cost_model, task_name=task.task_name,
                                     space_generator=space_generator, seed=seed + i)
        except Exception as e:  # a design space MetaSchedule cannot generate: keep the default
            picks.append(PredictedPick(task=task.task_name, outcome=None, tried=0,
                                       candidates=0, us=None, default_us=None,
                                       note=f"search failed: {str(e).splitlines()[0][:200]}",
                                       measured=on_device))
            continue
        pick = PredictedPick(task=task.task_name, outcome=None, tried=0,
                             candidates=len(ranked), us=None, default_us=None,
                             note="the search produced no candidate", measured=on_device)
        for n, (score, cand) in enumerate(ranked[:tries], start=1):
            if on_device:
                verdict = state.verifier.check(i, mod, cand.sch.mod)
                run_secs = [verdict.candidate_us / 1e6]
            else:
                verdict = Verdict.untimed(_offline_check(hw, cand.sch.mod, target))
                run_secs = [PREDICTED_RUN_S]
            outcome = state.settle(i, cand, verdict, run_secs, measured=on_device,
                                   source="cost-model pick", rank=n, score=score)
            pick = PredictedPick(task=task.task_name, outcome=outcome, tried=n,
                                 candidates=len(ranked), us=verdict.candidate_us,
                                 default_us=verdict.default_us, note=verdict.note,
                                 measured=on_device)
            if outcome is not Outcome.ACCEPTED:
                continue
            predicted[task.task_name] = {
                "score": score, "rank": n, "candidates": len(ranked),
                "measured": on_device, "verified": on_device,
                "checked": "device" if on_device else _check_kind(hw),
                **({"verify_us": pick.us, "default_us": pick.default_us} if on_device else {})}
            break
        if pick.outcome is Outcome.NOT_FASTER:  # every pick tried: correct, no faster
            slow[task.task_name] = {"tried": pick.tried, "default_us": pick.default_us}
        picks.append(pick)
    return picks
