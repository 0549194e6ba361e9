"""Tuning log directories: ``LOGS/<target>/``, one MetaSchedule database per target.

Layout of ``LOGS/<target>/``::

    database_workload.json          verified records: stock MetaSchedule JSONDatabase,
    database_tuning_record.json     what compile applies
    candidates/                     every measured candidate (resume, cost-model training)
    manifest.json                   versions, target, hardware hash, per-model plan and trials
    rejected.jsonl                  candidates that failed verification, with the error

One database per target because MetaSchedule's ``query_tuning_record`` ignores its
target argument: mixing targets in one database would apply one target's schedules to
another.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from ..errors import LogError

MANIFEST_SCHEMA = "tvm-fusion/logs"
MANIFEST_VERSION = 1


def target_dir(logs: str | os.PathLike, target_name: str) -> Path:
    """The directory of one target's records inside a log directory."""
    return Path(logs) / target_name


def open_database(path: Path, *, create: bool) -> ms.database.JSONDatabase | None:
    """The JSONDatabase in ``path``; None when it does not exist and ``create`` is False."""
    wl, rec = path / "database_workload.json", path / "database_tuning_record.json"
    if not create and not wl.exists():
        return None
    path.mkdir(parents=True, exist_ok=True)
    try:
        return ms.database.JSONDatabase(str(wl), str(rec), allow_missing=True)
    except Exception as e:  # TVM raises a bare error on a malformed file
        raise LogError(f"cannot read the tuning database in {path}: {e}. Move the broken "
                       "file away (keep a copy) and re-run; nothing else is lost") from e


def _versions() -> dict:
    from .. import __version__
    return {"tvm": tvm.__version__, "tvm_fusion": __version__}


def read_manifest(path: Path) -> dict:
    """The manifest of a target directory, or a fresh one when there is none."""
    f = path / "manifest.json"
    if not f.exists():
        return {"schema": MANIFEST_SCHEMA, "version": MANIFEST_VERSION, **_versions(),
                "models": {}}
    try:
        m = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise LogError(f"{f} is not valid JSON ({e}); restore it or delete it to start a "
                       "new manifest (the records themselves are kept)") from e
    if m.get("schema") != MANIFEST_SCHEMA or m.get("version") != MANIFEST_VERSION:
        raise LogError(f"{f} is schema {m.get('schema')!r} version {m.get('version')!r}; "
                       f"this tvm-fusion reads version {MANIFEST_VERSION}")
    return m


def write_manifest(path: Path, manifest: dict) -> None:
    """Write the manifest atomically (a crash leaves the old or the new one, whole)."""
    path.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".manifest.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    os.replace(tmp, path / "manifest.json")


def append_jsonl(path: Path, row: dict) -> None:
    """Append one JSON line, flushed to disk."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
