"""Stock TVM: FuseOps + MetaSchedule through TVM's own ``static_shape_tuning`` pipeline.

Nothing of tvm-fusion takes part but the Relax module (tvm-fusion's frontend imports
models that TVM's own importer rejects) and the target (the same ``tvm.target.Target``,
with ``mcpu`` and ``num-cores``). One knob is turned, and reported: the LocalBuilder
timeout (``--ms-builder-timeout``). MetaSchedule's default builder function imports
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

from tvm_fusion.tune.logdb import is_measured, read_run_times


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
def quiet_console():
    """MetaSchedule prints its task table to stdout after every batch; keep it in its logs."""
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    level = logger.level
    logger.setLevel(logging.WARNING)  # create_loggers takes the console level from here
    try:
        yield
    finally:
        logger.setLevel(level)


def tune_and_build(mod, target, work_dir: Path, trials: int, *,
                   builder_timeout: float | None):
    """Tune with the stock pipeline, then build with ``relax.build``'s default pipeline.

    Returns
    -------
    (executable, facts)
        ``facts``: tune_s, compile_s, scheduled (PrimFunc name -> bool) and the
        database statistics of :func:`database_stats`.
    """
    import tvm
    from tvm import relax

    from tvm_fusion.tune.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()  # the harness process only; builder workers pay it in full
    pipeline = relax.get_pipeline("static_shape_tuning", target=target,
                                  work_dir=str(work_dir), total_trials=trials)
    t0 = time.monotonic()
    with patched_builder_timeout(builder_timeout), quiet_console():
        tuned = pipeline(mod)
    tune_s = time.monotonic() - t0
    t0 = time.monotonic()
    executable = relax.build(tuned, target=target)
    compile_s = time.monotonic() - t0
    scheduled = {gv.name_hint: bool(f.attrs and f.attrs.get("tirx.is_scheduled", False))
                 for gv, f in tuned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    facts = {"tune_s": tune_s, "compile_s": compile_s, "scheduled": scheduled,
             "work_dir": str(work_dir), "builder_timeout_s": builder_timeout}
    facts.update(database_stats(work_dir))
    notes = [f"{facts['records']} candidates measured, {facts['failed']} failed "
             f"({facts['build_timeouts']} LocalBuilder timeouts); "
             f"{facts['workloads_with_record']}/{facts['workloads']} tuning tasks have a "
             "valid measurement"]
    notes.append(f"{facts['batches']} builder batches, each starting fresh workers that "
                 "import tvm.s_tir.tensor_intrin (builder timeout "
                 f"{builder_timeout or 30:.0f} s)")
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
