"""The tuning driver: plan, outline, search schedules with MetaSchedule, keep what is verified.

Every measured candidate goes to ``candidates/`` (MetaSchedule's own search database,
which also makes a re-run resume from the best schedules found so far). A candidate that
beats its task's best verified latency is checked against the unscheduled kernel on
random inputs; only then is it committed to the target's deployable database. Ctrl-C
lets the batch in flight finish, keeps everything measured, and returns.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from ..frontend import ImportedModel
from ..graph import build_graph
from ..plan import FusionPlan, make_plan
from ..targets import HardwareTarget, load_target
from .fast_import import build_kernel, import_tensor_intrinsics
from .logs import (add_trials, append_jsonl, kernel_table, open_database, read_manifest,
                   target_dir, target_identity, write_manifest)
from .progress import Progress
from .schedulable import make_schedulable
from .verify import KernelVerifier


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """What tuning achieved for one kernel."""

    name: str
    weight: int        # how many times the model calls it
    trials: int        # measured in this run
    best_us: float | None  # best verified latency, all runs together


@dataclass(frozen=True, kw_only=True)
class TuneReport:
    """Outcome of :func:`tune`."""

    target: str
    logs: Path
    plan: FusionPlan
    trials_run: int
    trials_total: int
    tasks: tuple[TaskResult, ...]
    rejected: int
    interrupted: bool
    elapsed_s: float

    @property
    def est_ms(self) -> float | None:
        """Sum of best kernel latencies times calls; None while a kernel has no record."""
        if any(t.best_us is None for t in self.tasks):
            return None
        return sum(t.best_us * t.weight for t in self.tasks) / 1e3


def _mean_us(run_secs) -> float:
    secs = [float(s) for s in run_secs]
    return sum(secs) / len(secs) * 1e6


def _latency_us(result) -> float | None:
    if result.error_msg is not None or not result.run_secs:
        return None
    return _mean_us(result.run_secs)


@derived_object
class _VerifyAndCommit(PyMeasureCallback):
    """Verifies each task's improving candidate and commits it to the deployable database."""

    def __init__(self, state: "_TuneState"):
        self.state = state

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        self.state.on_batch(task_scheduler, task_id, measure_candidates, runner_results)


class _TuneState:
    def __init__(self, *, tasks, target, accepted, tdir, progress, manifest, entry):
        self.tasks, self.target, self.accepted, self.tdir = tasks, target, accepted, tdir
        self.progress, self.manifest, self.entry = progress, manifest, entry
        self.verifier = KernelVerifier(target)
        self.workloads = [accepted.commit_workload(t.dispatched[0]) for t in tasks]
        self.best = []
        for wl in self.workloads:
            top = accepted.get_top_k(wl, 1)
            self.best.append(_mean_us(top[0].run_secs) if top else None)
        self.trials = [0] * len(tasks)
        self.rejected = 0
        self.stop = False
        self.index = list(range(len(tasks)))  # scheduler task id -> our task id

    def est_ms(self) -> float | None:
        known = [(b, t.weight) for b, t in zip(self.best, self.tasks) if b is not None]
        return sum(b * w for b, w in known) / 1e3 if known else None

    def on_batch(self, scheduler, task_id, candidates, results) -> None:
        if not candidates:  # a task whose search space is exhausted
            return
        task_id = self.index[task_id]  # this round may tune a subset of the tasks
        self.trials[task_id] += len(candidates)
        scored = [(lat, c) for c, r in zip(candidates, results)
                  if (lat := _latency_us(r)) is not None]
        for lat, cand in sorted(scored, key=lambda x: x[0]):
            best = self.best[task_id]
            if best is not None and lat >= best:
                break
            task = self.tasks[task_id]
            verdict = self.verifier.check(task_id, task.dispatched[0], cand.sch.mod)
            if verdict.accepted:
                self.accepted.commit_tuning_record(ms.database.TuningRecord(
                    trace=cand.sch.trace, workload=self.workloads[task_id],
                    run_secs=[lat / 1e6], target=self.target, args_info=cand.args_info))
                self.best[task_id] = lat
                break
            if verdict.error is None:
                # Correct but no faster than the default loops: keep the default. The
                # rest of this batch measured slower still.
                break
            self.rejected += 1
            append_jsonl(self.tdir / "rejected.jsonl", {
                "task": task.task_name, "latency_us": lat, "error": verdict.error,
                "trace": str(cand.sch.trace)[:4000]})
        add_trials(self.tdir, self.manifest, self.entry, len(candidates))  # locked, shared
        have = sum(b is not None for b in self.best)
        note = "" if have == len(self.best) else f"({have}/{len(self.best)} kernels)"
        if self.stop:
            note += " stopping after this batch"
        self.progress.update(self.entry["trials"], self.est_ms(), note=note.strip())
        if self.stop:
            for i in range(len(self.index)):
                scheduler.terminate_task(i)


def tune(model: ImportedModel, target: str | HardwareTarget = "host", *, trials: int,
         logs: str | Path, plan: FusionPlan | None = None, planner: str = "cost",
         progress: bool = True,
         seed: int = 0, trials_per_batch: int = 16) -> TuneReport:
    """Tune every fused kernel of ``model`` and append verified records to ``logs``.

    Parameters
    ----------
    model : ImportedModel
        From :func:`~tvm_fusion.import_model`.
    target : str or HardwareTarget
        A name from ``hw_targets/`` or ``"host"``.
    trials : int
        Total measurements for this model on this target, earlier runs included: a
        re-run with the same number does nothing, a larger one continues.
    logs : path
        Log directory; records go to ``logs/<target>/``.
    plan : FusionPlan, optional
        The partition to tune. Default: the plan stored for this model in the logs
        (so a resumed run tunes the same kernels), else a fresh plan by ``planner``.
    planner : str
        ``"fuseops"`` or ``"cost"`` (see :func:`~tvm_fusion.plan_fusion`), used when
        neither ``plan`` nor a stored plan is there.
    progress : bool
        Draw a progress bar on stderr.
    seed : int
        Seed of the search.
    trials_per_batch : int
        Candidates measured per task per round.

    Returns
    -------
    TuneReport
    """
    t0 = time.monotonic()
    hw = target if isinstance(target, HardwareTarget) else load_target(target)
    tvm_target = hw.tvm_target()
    graph = build_graph(model.mod)
    tdir = target_dir(logs, hw.name)
    manifest = read_manifest(tdir, expect=hw)  # refuses another TVM version or target
    manifest["target"] = target_identity(hw)
    entry = manifest["models"].get(model.model_hash)
    if plan is None and entry is not None:
        plan = FusionPlan.from_json(entry["plan"])
    if plan is None:
        plan = make_plan(graph, hw, planner)
    plan, _, tasks = make_schedulable(graph, plan, hw, tvm_target)
    if entry is None or entry["plan"]["hash"] != plan.hash:
        entry = {"source": model.source, "trials": 0, "plan": plan.to_json(),
                 "inputs": {t.name: list(t.shape) for t in model.inputs}}
        manifest["models"][model.model_hash] = entry
    accepted = open_database(tdir, create=True)
    remaining = max(trials - entry["trials"], 0)
    bar = Progress(trials, done=entry["trials"], enabled=progress)
    state = _TuneState(tasks=tasks, target=tvm_target, accepted=accepted, tdir=tdir,
                       progress=bar, manifest=manifest, entry=entry)
    entry["kernels"] = kernel_table(accepted, tasks, state.workloads)
    write_manifest(tdir, manifest)
    interrupted = False
    if remaining > 0 and tasks:
        interrupted = _run_search(state, tasks, tvm_target, tdir, remaining, seed,
                                  trials_per_batch)
    bar.close()
    results = tuple(TaskResult(name=t.task_name, weight=int(t.weight), trials=n, best_us=b)
                    for t, n, b in zip(tasks, state.trials, state.best))
    return TuneReport(target=hw.name, logs=Path(logs), plan=plan,
                      trials_run=sum(state.trials), trials_total=entry["trials"],
                      tasks=results, rejected=state.rejected, interrupted=interrupted,
                      elapsed_s=time.monotonic() - t0)


def _run_search(state, tasks, tvm_target, tdir, remaining, seed, per_batch) -> bool:
    """Run MetaSchedule over ``tasks`` for ``remaining`` trials; True if interrupted.

    The budget is split evenly over the tasks (MetaSchedule's default would spend it 64
    at a time on the first few tasks). A task whose search space runs dry returns its
    share, which the next round spreads over the tasks that used all of theirs.
    """
    import_tensor_intrinsics()  # before TuneContext does it the slow way
    (tdir / "candidates").mkdir(parents=True, exist_ok=True)
    candidates_db = open_database(tdir / "candidates", create=True)  # crash/share-safe
    runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
        number=5, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False))
    callbacks = ms.MeasureCallback.create("default") + [_VerifyAndCommit(state)]

    def on_sigint(signum, frame):
        if state.stop:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        state.stop = True
        state.progress.stream.write(
            "\nCtrl-C: finishing the batch in flight, then saving. Ctrl-C again to abort.\n")

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    todo = list(range(len(tasks)))
    try:
        for round_ in range(3):
            if remaining <= 0 or not todo or state.stop:
                break
            per_task = max(1, math.ceil(remaining / len(todo)))
            # MetaSchedule's console log repeats its task table after every batch; keep
            # it in the files under candidates/logs and show our progress bar instead.
            # (Its logger set-up resets the level on every call, so set it every round.)
            logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
            strategy = ms.search_strategy.EvolutionarySearch(
                population_size=64, init_min_unmeasured=16, genetic_num_iters=1)
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [tasks[i] for i in todo], str(tdir / "candidates"), strategy=strategy,
                num_threads="physical", seed=seed + round_)
            state.index = todo
            before = list(state.trials)
            ms.tune_tasks(
                tasks=contexts, task_weights=weights, work_dir=str(tdir / "candidates"),
                max_trials_global=remaining, max_trials_per_task=per_task,
                num_trials_per_iter=min(per_batch, per_task),
                builder=ms.builder.LocalBuilder(timeout_sec=60, f_build=build_kernel),
                runner=runner, database=candidates_db, measure_callbacks=callbacks,
                task_scheduler="round-robin")
            ran = {i: state.trials[i] - before[i] for i in todo}
            remaining -= sum(ran.values())
            if not any(ran.values()):
                break
            todo = [i for i in todo if ran[i] >= per_task]
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, old)
    return state.stop
