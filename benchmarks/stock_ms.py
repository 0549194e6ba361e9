"""Stock TVM: FuseOps + MetaSchedule through TVM's own ``static_shape_tuning`` pipeline.

Nothing of tvm-fusion takes part but the Relax module (tvm-fusion's frontend imports
models that TVM's own importer rejects) and the target (the same ``tvm.target.Target``,
with ``mcpu`` and ``num-cores``). The pipeline runs the way TVM's docs say it runs best
on a CPU (``static_shape_tuning_pipeline``'s docstring): ``cpu_weight_prepack=True`` on
LLVM targets (weights marked layout-free, so ``RewriteLayout`` packs them; with the
weights as constants the packed weights fold into the module and ``main`` keeps its
signature), and ``max_trials_per_task`` set to the per-task budget with ``total_trials``
that budget times the task count, so every task is tuned (by default MetaSchedule spends
its whole budget 64 trials at a time on the first few tasks). One knob is turned, and
reported: the LocalBuilder
timeout (``--ms-builder-timeout``); the smoke tests turn a second, also reported, to
keep stock MetaSchedule's search within seconds per task: its evolutionary search's
population (``--ms-population``, default MetaSchedule's 512). MetaSchedule's default builder function imports
``tvm.s_tir.tensor_intrin`` inside each build job, and its pool starts fresh workers
for every batch, so the first job of every worker pays that import: 25-60 s on a
2-core machine, longer than the builder's default 30 s timeout. As shipped, every
build then times out and nothing is tuned. Pass ``--ms-builder-timeout 30`` to see that.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from pathlib import Path

import numpy as np

from tvm_fusion.logs.logdb import is_measured, read_run_times
from tvm_fusion.compat.ms_compat import drop_unnamed_handlers


@contextlib.contextmanager
def patched_builder_timeout(seconds: float | None):
    """Give MetaSchedule's ``Builder.create("local")`` a default ``timeout_sec``."""
    from tvm.s_tir.meta_schedule.builder import Builder

    original = Builder.__dict__["create"]
    if seconds is None:
        yield
        return

    def create(kind="local", *args, **kwargs):
        if kind == "local":
            kwargs.setdefault("timeout_sec", float(seconds))
        return original.__func__(kind, *args, **kwargs)

    Builder.create = staticmethod(create)
    try:
        yield
    finally:
        Builder.create = original


@contextlib.contextmanager
def patched_population(size: int | None):
    """Give MetaSchedule's ``SearchStrategy.create("evolutionary")`` a population size.

    Its default, 512 random samples evolved 4 times per batch, is most of a small task's
    tuning time (8-25 s per task on 2 cores, even at one trial per task).
    """
    from tvm.s_tir.meta_schedule.search_strategy import SearchStrategy

    original = SearchStrategy.__dict__["create"]
    if size is None:
        yield
        return

    def create(kind="evolutionary", *args, **kwargs):
        if kind == "evolutionary":
            kwargs.setdefault("population_size", int(size))
            kwargs.setdefault("init_min_unmeasured", min(int(size), 50))
        return original.__func__(kind, *args, **kwargs)

    SearchStrategy.create = staticmethod(create)
    try:
        yield
    finally:
        SearchStrategy.create = original


@contextlib.contextmanager
def quiet_console():
    """MetaSchedule prints its task table to stdout after every batch; keep it in its logs."""
    # a handler without a name on its logger (one an earlier tune_metaschedule caller or
    # pytest left) crashes MetaSchedule's logger set-up: 'NoneType' object has no
    # attribute 'format'
    drop_unnamed_handlers()
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    level = logger.level
    logger.setLevel(logging.WARNING)  # create_loggers takes the console level from here
    try:
        yield
    finally:
        logger.setLevel(level)


def count_tasks(mod, target) -> int:
    """Tuning tasks MetaSchedule extracts from the module ``static_shape_tuning`` tunes."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion.explore.tuning import _stock_module

    return len(ms.relax_integration.extract_tasks(_stock_module(mod, target), target))


def tune_and_build(mod, target, work_dir: Path, trials: int, *,
                   builder_timeout: float | None, per_task: int | None = None,
                   prepack: bool | None = None, population: int | None = None):
    """Tune with the stock pipeline, then build with ``relax.build``'s default pipeline.

    Parameters
    ----------
    trials : int
        Total trials (``total_trials``); 0 applies the database in ``work_dir`` only.
    per_task : int, optional
        ``max_trials_per_task``; default ``ceil(trials / tasks)``, an even share. When
        given, ``total_trials`` grows to ``per_task x tasks`` if ``trials`` is smaller, so
        every task gets the full per-task budget.
    prepack : bool, optional
        ``cpu_weight_prepack``; default on for LLVM targets. Applying an earlier
        database (``trials=0``) needs the setting it was tuned with.
    population : int, optional
        The evolutionary search's population size; default MetaSchedule's (512).

    Returns
    -------
    (executable, facts)
        ``facts``: tune_s, compile_s, scheduled (PrimFunc name -> bool), the settings
        (prepack, per_task, tasks) and the database statistics of :func:`database_stats`.
    """
    import math

    import tvm
    from tvm import relax

    from tvm_fusion.compat.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()  # the harness process only; builder workers pay it in full
    if prepack is None:
        prepack = str(target.kind.name) == "llvm"
    n_tasks = count_tasks(mod, target)
    if per_task is None:
        per_task = max(1, math.ceil(trials / max(n_tasks, 1)))
    elif trials:  # an explicit per-task budget: room for it on every task
        trials = max(trials, per_task * n_tasks)
    pipeline = relax.get_pipeline("static_shape_tuning", target=target,
                                  work_dir=str(work_dir), total_trials=trials,
                                  cpu_weight_prepack=prepack, max_trials_per_task=per_task)
    t0 = time.monotonic()
    with patched_builder_timeout(builder_timeout), patched_population(population), \
            quiet_console():
        tuned = pipeline(mod)
    tune_s = time.monotonic() - t0
    t0 = time.monotonic()
    executable = relax.build(tuned, target=target)
    compile_s = time.monotonic() - t0
    scheduled = {gv.name_hint: bool(f.attrs and f.attrs.get("tirx.is_scheduled", False))
                 for gv, f in tuned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    facts = {"tune_s": tune_s, "compile_s": compile_s, "scheduled": scheduled,
             "work_dir": str(work_dir), "builder_timeout_s": builder_timeout,
             "prepack": prepack, "per_task": per_task, "tasks": n_tasks,
             "population": population, "total_trials": trials}
    facts.update(database_stats(work_dir))
    notes = [f"cpu_weight_prepack={prepack}, max_trials_per_task={per_task} over {n_tasks} "
             "tasks",
             f"{facts['records']} candidates measured, {facts['failed']} failed "
             f"({facts['build_timeouts']} LocalBuilder timeouts); "
             f"{facts['workloads_with_record']}/{facts['workloads']} tuning tasks have a "
             "valid measurement"]
    notes.append(f"{facts['batches']} builder batches, each starting fresh workers that "
                 "import tvm.s_tir.tensor_intrin (builder timeout "
                 f"{builder_timeout or 30:.0f} s)")
    if population is not None:
        notes.append(f"evolutionary search population {population} (MetaSchedule's: 512)")
    facts["notes"] = notes
    return executable, facts


def database_stats(work_dir: Path) -> dict:
    hashes, records = read_run_times(work_dir)
    ok = {idx for idx, secs in records if is_measured(secs)}
    logs = list((Path(work_dir) / "logs").glob("*.log"))
    timeouts = batches = 0
    for log in logs:
        text = log.read_text(errors="replace")
        timeouts += text.count("LocalBuilder: Timeout")
        batches += len(re.findall(r"Sending \d+ candidates?\(s\) for measurement", text))
    return {"workloads": len(hashes), "workloads_with_record": len(ok),
            "records": len(records), "failed": sum(not is_measured(s) for _, s in records),
            "build_timeouts": timeouts, "batches": batches}


def wrong_kernels(work_dir: Path, target, tol: float = 1e-3) -> list[dict]:
    """Replay each task's best record of a stock MetaSchedule database and compare it
    with the task's unscheduled kernel on tvm-fusion's seeded random buffers.

    MetaSchedule checks nothing it measures, so when its module's output is wrong this
    names the kernels that made it so. Returns one dict per wrong task: ``blocks`` (its
    TIR block names, which say which ops it fuses), ``max_rel_err``, ``run_us`` (the
    record's measured time) and ``correct_records`` (how many of the task's records,
    replayed the same way, are right).
    """
    import tvm_ffi
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion.reference import max_rel_error
    from tvm_fusion.tune.verify import reference_run, run_kernel

    db = ms.database.JSONDatabase(str(Path(work_dir) / "database_workload.json"),
                                  str(Path(work_dir) / "database_tuning_record.json"))
    workloads = {tvm_ffi.structural_hash(r.workload.mod): r.workload
                 for r in db.get_all_tuning_records()}

    def error(mod, record, ref) -> float:
        sch = s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        got, _ = run_kernel(sch.mod, target)
        return max((max_rel_error(g, w) for g, w in zip(got, ref)), default=0.0)

    wrong = []
    for workload in workloads.values():
        records = db.get_top_k(workload, 1 << 20)
        if not records:
            continue
        mod = workload.mod
        ref = reference_run(mod, target).outputs
        err = error(mod, records[0], ref)
        if err <= tol:
            continue
        blocks = _blocks(mod)
        right = sum(error(mod, r, ref) <= tol for r in records[1:])
        wrong.append({"blocks": blocks, "max_rel_err": err,
                      "run_us": float(np.mean([float(s) for s in records[0].run_secs])) * 1e6,
                      "records": len(records), "correct_records": right})
    return wrong



def _blocks(mod) -> list[str]:
    """Names of the blocks under ``mod``'s root block, in order."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
