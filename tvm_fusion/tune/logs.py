"""Tuning log directories: ``LOGS/<target>/``, one MetaSchedule database per target.

Layout of ``LOGS/<target>/``::

    database_workload.json          verified records: stock MetaSchedule JSONDatabase
    database_tuning_record.json     files (read and written by logdb.LogDatabase), what
                                    compile applies
    candidates/                     every measured candidate (resume, cost-model training)
    manifest.json                   schema, TVM and tvm-fusion versions, target key and
                                    hardware hash, per model: inputs, plan, kernels, trials
    rejected.jsonl                  candidates that failed verification, with the error
    .lock                           flock of the writers (tuners, merge, prune)

One database per target because MetaSchedule's ``query_tuning_record`` ignores its
target argument: mixing targets in one database would apply one target's schedules to
another.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import tvm

from ..errors import LogError
from ..version import __version__
from .logdb import RECORD_FILE, WORKLOAD_FILE, DirLock, LogDatabase, append_line

MANIFEST_SCHEMA = "tvm-fusion/logs"
MANIFEST_VERSION = 1


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


def saved_trials(tdir: Path, model_hash: str) -> int | None:
    """The trial count ``tdir``'s manifest holds for a model, as on disk; None if unread."""
    try:
        return int(json.loads((tdir / "manifest.json").read_text())["models"][model_hash]
                   ["trials"])
    except (OSError, ValueError, KeyError, TypeError):
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

    Unreadable lines are skipped with one :class:`~tvm_fusion.tune.logdb.CorruptLogWarning`.
    """
    if not create and not (path / WORKLOAD_FILE).exists():
        return None
    try:
        return LogDatabase(path, writable=create)
    except OSError as e:
        raise LogError(f"cannot open the tuning database in {path}: {e}") from e


def versions() -> dict:
    """The versions a manifest records: TVM and tvm-fusion."""
    return {"tvm": tvm.__version__, "tvm_fusion": __version__}


def target_key(tvm_config) -> str:
    """Canonical JSON of a TVM target config: what "the same target" means to a log."""
    return json.dumps(json.loads(json.dumps(tvm_config, default=dict)), sort_keys=True,
                      separators=(",", ":"))


def target_identity(hw) -> dict:
    """The ``target`` block of a manifest for hardware ``hw``."""
    return {"name": hw.name, "key": target_key(hw.tvm_config),
            "tvm": json.loads(json.dumps(hw.tvm_config, default=dict)),
            "hardware_hash": hw.hardware_hash}


def fresh_manifest() -> dict:
    return {"schema": MANIFEST_SCHEMA, "version": MANIFEST_VERSION, **versions(), "models": {}}


def load_manifest_raw(path: Path) -> dict | None:
    """The manifest of a target directory as stored, unchecked; None if there is none."""
    f = path / "manifest.json"
    if not f.exists():
        return None
    try:
        m = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise LogError(f"{f} is not valid JSON ({e}); restore it or delete it to start a "
                       "new manifest (the records themselves are kept)") from e
    if not isinstance(m, dict):
        raise LogError(f"{f} is not a tvm-fusion manifest (a JSON object expected, got "
                       f"{type(m).__name__})")
    return m


def manifest_problems(m: dict, path: Path, hw=None) -> tuple[list[str], list[str]]:
    """What keeps a manifest from being used here: (version problems, target problems).

    Each problem is a sentence that says what was expected, what was found and what
    to do about it.
    """
    f = path / "manifest.json"
    version, target = [], []
    if m.get("schema") != MANIFEST_SCHEMA or m.get("version") != MANIFEST_VERSION:
        version.append(
            f"{f} is schema {m.get('schema')!r} version {m.get('version')!r}; this "
            f"tvm-fusion reads {MANIFEST_SCHEMA!r} version {MANIFEST_VERSION}. Use the "
            f"tvm-fusion that wrote it (it recorded {m.get('tvm_fusion')!r}), or re-tune "
            "into a new log directory")
    if m.get("tvm") != tvm.__version__:
        version.append(
            f"{f} was written with TVM {m.get('tvm')!r}, this is TVM {tvm.__version__}. "
            "Records are not carried across TVM versions (workload hashes and schedule "
            "traces change between them, and a stale record is applied silently or not at "
            f"all), so they are refused. Install TVM {m.get('tvm')} to deploy them, or "
            "re-tune with this TVM into a new log directory; `tvm-fusion logs validate` "
            "shows which records still replay")
    stored = m.get("target")
    if hw is not None and stored is not None:
        here = target_identity(hw)
        key = stored.get("key") or target_key(stored.get("tvm", {}))
        diffs = []
        if key != here["key"]:
            mine, theirs = json.loads(here["key"]), json.loads(key)
            diffs += [f"{k}: logs {theirs.get(k)!r}, here {mine.get(k)!r}"
                      for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
        if (stored.get("hardware_hash") != here["hardware_hash"]
                and not (key == here["key"]
                         and stored.get("hardware_hash") in hw.previous_hashes)):
            diffs.append(f"hardware hash: logs {str(stored.get('hardware_hash'))[:12]}, "
                         f"here {here['hardware_hash'][:12]}")
        if diffs:
            target.append(
                f"{path} holds records tuned for another target than this "
                f"{hw.name!r} ({'; '.join(diffs)}). Schedules tuned for other hardware "
                "can be slow or fail here, so they are refused; to deploy them anyway pass "
                "allow_other_target=True (CLI: --allow-other-target), or tune for this "
                "target into a new log directory"
                + ("" if key != here["key"] else
                   ". The TVM target is the same: only the description's numbers differ "
                   "(a re-measured or calibrated file); if the records were measured on "
                   "this machine they still hold, and --allow-other-target uses them"))
    return version, target


def read_manifest(path: Path, *, expect=None, allow_other_target: bool = False) -> dict:
    """The manifest of a target directory, checked; a fresh one when there is none.

    Parameters
    ----------
    path : Path
        The target directory (``LOGS/<target>``).
    expect : HardwareTarget, optional
        The hardware the records will be used on: a manifest of another target key or
        hardware hash is refused unless ``allow_other_target``.
    allow_other_target : bool
        Use records of another target anyway.

    Raises
    ------
    LogError
        Another manifest schema or TVM version, or (without ``allow_other_target``)
        another target.
    """
    m = load_manifest_raw(path)
    if m is None:
        return fresh_manifest()
    version, target = manifest_problems(m, path, expect)
    if version:
        raise LogError(version[0])
    if target and not allow_other_target:
        raise LogError(target[0])
    m.setdefault("models", {})
    return m


def _write_atomic(path: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".manifest.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path / "manifest.json")


def _merge_models(disk: dict, ours: dict) -> dict:
    """Models of ``ours`` over those on disk; a model tuned elsewhere meanwhile is kept.

    For the same model and plan the larger trial count wins (another process may have
    counted trials since ``ours`` was read).
    """
    models = dict(disk)
    for h, entry in ours.items():
        old = disk.get(h)
        if old is not None and old.get("plan", {}).get("hash") == entry.get("plan", {}).get("hash"):
            entry = {**entry, "trials": max(entry.get("trials", 0), old.get("trials", 0))}
        models[h] = entry
    return models


def write_manifest(path: Path, manifest: dict) -> None:
    """Write the manifest atomically under the directory lock, merged with the one on disk.

    A crash leaves the old or the new file, whole; a second process writing the same
    directory keeps its models (see :func:`_merge_models`).
    """
    path.mkdir(parents=True, exist_ok=True)
    with DirLock(path, exclusive=True):
        disk = load_manifest_raw(path) or {}
        out = {**manifest, "models": _merge_models(disk.get("models", {}),
                                                   manifest.get("models", {}))}
        _write_atomic(path, out)


def add_trials(path: Path, manifest: dict, entry: dict, n: int) -> int:
    """Add ``n`` measured trials to ``entry`` (a model of ``manifest``) and save, locked.

    Counts of other processes tuning the same model meanwhile are kept: the count on disk
    is read and incremented under the lock. Returns the new total (also set in
    ``entry``).
    """
    key = next(h for h, e in manifest["models"].items() if e is entry)
    with DirLock(path, exclusive=True):
        disk = load_manifest_raw(path) or {}
        models = disk.get("models", {})
        old = models.get(key)
        base = entry.get("trials", 0)
        if old is not None and old.get("plan", {}).get("hash") == entry["plan"]["hash"]:
            base = old.get("trials", 0)
        entry["trials"] = base + n
        models[key] = copy.deepcopy(entry)
        _write_atomic(path, {**manifest, "models": models})
    return entry["trials"]


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
