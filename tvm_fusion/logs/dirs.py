"""Tuning log directories: ``LOGS/<target>/``, one MetaSchedule database per target.

Layout of ``LOGS/<target>/``::

    database_workload.json          verified records: stock MetaSchedule JSONDatabase
    database_tuning_record.json     files (read and written by logdb.LogDatabase), what
                                    compile applies
    candidates/                     every measured candidate (resume, cost-model training)
    manifest.json                   schema, TVM and tvm-fusion versions, target key and
                                    hardware hash, per model: inputs, plan, kernels, trials
                                    (read and written by manifest.py)
    rejected.jsonl                  candidates that failed verification, with the error
    .lock                           flock of the writers (tuners, merge, prune)

One database per target because MetaSchedule's ``query_tuning_record`` ignores its
target argument: mixing targets in one database would apply one target's schedules to
another.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from ..errors import LogError
from .logdb import RECORD_FILE, WORKLOAD_FILE, DirLock, LogDatabase, append_line


def target_dir(logs: str | os.PathLike, target_name: str) -> Path:
    """The directory of one target's records inside a log directory."""
    name = Path(target_name)
    if name.is_absolute() or len(name.parts) != 1 or target_name in (".", ".."):
        # load_target refuses such names; a HardwareTarget built by hand might not
        raise LogError(f"target name {target_name!r} is not a plain name, so its logs would "
                       f"lie outside {logs}; name the target like 'my_gpu'")
    return Path(logs) / target_name


def check_writable(tdir: Path) -> None:
    """Fail early, naming the directory, when tuning cannot write its records there."""
    try:
        tdir.mkdir(parents=True, exist_ok=True)
        with DirLock(tdir, exclusive=True), tempfile.TemporaryFile(dir=tdir):
            pass
    except OSError as e:
        keep = (f" (copy {tdir.parent} there to continue from its records)"
                if tdir.is_dir() else "")
        raise LogError(f"cannot write the tuning logs in {tdir} ({e.strerror}); tuning "
                       "appends its records there: make it writable, or pass --logs a "
                       f"directory you can write{keep}") from None


# errno values that say the log directory cannot take more (the user's environment, not
# a bug): full disk or quota, a file-size limit, read-only, no permission
_WRITE_FAULTS = {errno.ENOSPC: "no space left on the device",
                 errno.EDQUOT: "the disk quota is exceeded",
                 errno.EFBIG: "a file would exceed the file-size limit (ulimit -f)",
                 errno.EROFS: "the file system is read-only",
                 errno.EACCES: "permission denied", errno.EPERM: "the operation is not "
                 "permitted (a read-only or immutable directory)"}


def write_fault(exc: BaseException) -> str | None:
    """What ``exc`` says about the log directory when it is a write that the machine
    refused (:data:`_WRITE_FAULTS`), else None. An ``OSError`` raised in one of our
    callbacks inside MetaSchedule's tuning loop comes back through TVM's FFI as a
    ``RuntimeError`` whose text starts ``[Errno N]``: both forms are read."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _WRITE_FAULTS:
            return _WRITE_FAULTS[exc.errno]
        m = re.search(r"\[Errno (\d+)\]", str(exc))
        if m and int(m.group(1)) in _WRITE_FAULTS:
            return _WRITE_FAULTS[int(m.group(1))]
        exc = exc.__cause__ or exc.__context__
    return None


def orphaned_records(tdir: Path) -> int:
    """Measured records in ``tdir`` that no manifest counts (its manifest.json is gone)."""
    if (tdir / "manifest.json").exists():
        return 0
    counts = []
    for db in (tdir / "candidates", tdir):
        try:
            counts.append((db / RECORD_FILE).read_bytes().count(b"\n"))
        except OSError:
            counts.append(0)
    return max(counts)


def open_database(path: Path, *, create: bool) -> LogDatabase | None:
    """The database in ``path`` (read-write with ``create``); None if absent and not ``create``.

    Unreadable lines are skipped with one :class:`~tvm_fusion.logs.logdb.CorruptLogWarning`.
    """
    if not create and not (path / WORKLOAD_FILE).exists():
        return None
    try:
        return LogDatabase(path, writable=create)
    except OSError as e:
        raise LogError(f"cannot open the tuning database in {path}: {e}") from e


def kernel_table(database: LogDatabase, tasks, workloads) -> dict:
    """``{kernel name: {"workload": key, "calls": n}}`` for a model's manifest entry.

    What ``logs show`` and ``logs prune`` use to tell which workloads serve which models.
    """
    return {t.task_name: {"workload": database.workload_key(wl), "calls": int(t.weight)}
            for t, wl in zip(tasks, workloads)}


def content_hash(path: Path) -> str:
    """sha256 of a target directory's manifest and deployable database files."""
    digest = hashlib.sha256()
    for name in ("manifest.json", WORKLOAD_FILE, RECORD_FILE):
        f = path / name
        digest.update(name.encode() + b"\0")
        digest.update(f.read_bytes() if f.exists() else b"<absent>")
    return digest.hexdigest()


def append_jsonl(path: Path, row: dict) -> None:
    """Append one JSON line in one write, fsynced, under the directory lock."""
    with DirLock(path.parent, exclusive=True):
        append_line(path, json.dumps(row))
