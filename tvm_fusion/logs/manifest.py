"""The manifest of a tuning-log target directory (``LOGS/<target>/manifest.json``).

:class:`Manifest` and :class:`ModelEntry` are the typed reading of the file; this module
is the one place that turns its JSON into them, checks it against the hardware, and
writes it (atomic, under the directory lock, merged with what other processes wrote
meanwhile).

The file (schema 1)::

    {"schema": "tvm-fusion/logs", "version": 1, "tvm": "0.27.0...", "tvm_fusion": "...",
     "target": {"name", "key", "tvm", "hardware_hash"},
     "models": {model hash: {"source", "trials", "plan", "inputs", "consts"?,
                             "prepack"?, "kernels"?, "predicted"?, ...}}}

Fields this version does not type (``predicted_no_gain``, ``offline``, anything a later
version adds) are kept as read and written back unchanged.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import tvm

from ..errors import LogError
from ..plan import FusionPlan
from ..version import __version__
from .logdb import DirLock

MANIFEST_SCHEMA = "tvm-fusion/logs"
MANIFEST_VERSION = 1
MANIFEST_FILE = "manifest.json"


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


@dataclass(frozen=True, kw_only=True)
class KernelUse:
    """One kernel of a model's plan with a record: its workload key and calls per run.

    Attributes
    ----------
    workload : str
        MetaSchedule's workload hash of the kernel's task.
    calls : int or None
        How often one run of the model calls it; None: not recorded (read as 1).
    """

    workload: str
    calls: int | None = None

    @classmethod
    def from_json(cls, d: Mapping) -> "KernelUse":
        return cls(workload=d.get("workload"), calls=d.get("calls"))

    def to_json(self) -> dict:
        return {"workload": self.workload,
                **({} if self.calls is None else {"calls": self.calls})}


# the keys ModelEntry types, in the order tune writes them
_ENTRY_KEYS = ("source", "trials", "plan", "inputs", "consts", "prepack", "kernels",
               "predicted")


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """One model of a manifest: how it was imported, its plan, what was tuned.

    Attributes
    ----------
    source : str or None
        The model as named to ``tune`` (a file, a zoo name).
    trials : int
        Candidates measured for it so far.
    plan : Mapping
        Its :class:`~tvm_fusion.plan.FusionPlan` as stored (JSON; parsed on demand by
        :meth:`fusion_plan`, so that a broken plan does not hide the rest of the entry).
    inputs : Mapping of str to tuple of int
        Input shapes it was imported with.
    consts : Mapping or None
        ``--const`` input values it was imported with (flattened); None: none.
    prepack : bool or None
        Tuned with prepacked weights; None: the field is absent (tuned without, or
        before prepacking existed).
    kernels : Mapping of str to KernelUse, or None
        Kernel name -> its record's workload; None: no kernel table (older logs).
    predicted : Mapping or None
        Kernel name -> how a dry run's cost-model pick was checked (``measured``...).
    extra : Mapping
        Every other field, kept as read.
    """

    source: str | None = None
    trials: int = 0
    plan: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    consts: Mapping[str, list] | None = None
    prepack: bool | None = None
    kernels: Mapping[str, KernelUse] | None = None
    predicted: Mapping[str, Mapping[str, Any]] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping) -> "ModelEntry":
        """The entry as stored; missing fields take their defaults, nothing is checked."""
        kernels = d.get("kernels")
        return cls(source=d.get("source"), trials=d.get("trials", 0), plan=d.get("plan", {}),
                   inputs={k: tuple(v) for k, v in d.get("inputs", {}).items()},
                   consts=d.get("consts"), prepack=d.get("prepack"),
                   kernels=None if kernels is None else
                   {k: KernelUse.from_json(v) for k, v in kernels.items()},
                   predicted=d.get("predicted"),
                   extra={k: v for k, v in d.items() if k not in _ENTRY_KEYS})

    def to_json(self) -> dict:
        """The entry as stored (a fresh dict; its plan and extra fields are shared)."""
        out = {**({} if self.source is None else {"source": self.source}),
               "trials": self.trials, "plan": self.plan,
               "inputs": {k: list(v) for k, v in self.inputs.items()}}
        if self.consts is not None:
            out["consts"] = self.consts
        if self.prepack is not None:
            out["prepack"] = self.prepack
        if self.kernels is not None:
            out["kernels"] = {k: v.to_json() for k, v in self.kernels.items()}
        if self.predicted is not None:
            out["predicted"] = copy.deepcopy(self.predicted)
        return {**out, **self.extra}

    @property
    def plan_hash(self) -> str | None:
        return self.plan.get("hash") if isinstance(self.plan, Mapping) else None

    def fusion_plan(self):
        """The stored plan, parsed (raises :class:`~tvm_fusion.errors.PlanError`)."""
        return FusionPlan.from_json(self.plan)

    @property
    def tuned_prepack(self) -> bool:
        """Whether its records are of prepacked kernels (absent field: no)."""
        return bool(self.prepack)

    @property
    def unmeasured(self) -> frozenset[str]:
        """Kernels whose record is a dry run's pick, never run on the device."""
        return frozenset(n for n, p in (self.predicted or {}).items()
                         if not p.get("measured", True))

    def shape_specs(self, sep: str = ",") -> list[str]:
        """``name=d0<sep>d1...`` per input, as ``--shape`` takes them."""
        return [f"{k}={sep.join(map(str, v))}" for k, v in self.inputs.items()]

    def label(self, model_hash: str) -> str:
        """``file[name=AxB]#hash8``: how ``logs`` commands name the model."""
        return (f"{Path(self.source or '?').name}[{','.join(self.shape_specs('x'))}]"
                f"#{model_hash[:8]}")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A target directory's manifest.

    Attributes
    ----------
    schema, version : str, int
        The file format (:data:`MANIFEST_SCHEMA`, :data:`MANIFEST_VERSION`).
    tvm, tvm_fusion : str
        The versions that wrote it.
    target : Mapping or None
        Identity of the hardware it was tuned for (:func:`target_identity`).
    models : Mapping of str to ModelEntry
        Model hash -> entry.
    extra : Mapping
        Every other top-level field, kept as read.
    """

    schema: Any = MANIFEST_SCHEMA
    version: Any = MANIFEST_VERSION
    tvm: str | None = None
    tvm_fusion: str | None = None
    target: Mapping[str, Any] | None = None
    models: Mapping[str, ModelEntry] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def fresh(cls, hw=None) -> "Manifest":
        """An empty manifest of this TVM and tvm-fusion (for ``hw``, when given)."""
        return cls(**versions(), target=None if hw is None else target_identity(hw))

    @classmethod
    def from_json(cls, d: Mapping) -> "Manifest":
        """The manifest as stored; nothing is checked (see :func:`manifest_problems`)."""
        known = ("schema", "version", "tvm", "tvm_fusion", "target", "models")
        bad = [h for h, e in (d.get("models") or {}).items() if not isinstance(e, Mapping)]
        if bad:
            raise LogError(f"manifest model {bad[0]!r} is not a JSON object (edited by "
                           "hand?); restore the manifest, or delete the entry to drop it")
        return cls(schema=d.get("schema"), version=d.get("version"), tvm=d.get("tvm"),
                   tvm_fusion=d.get("tvm_fusion"), target=d.get("target"),
                   models={h: ModelEntry.from_json(e)
                           for h, e in (d.get("models") or {}).items()},
                   extra={k: v for k, v in d.items() if k not in known})

    def to_json(self) -> dict:
        out = {"schema": self.schema, "version": self.version, "tvm": self.tvm,
               "tvm_fusion": self.tvm_fusion}
        if self.target is not None:
            out["target"] = self.target
        return {**out, "models": {h: e.to_json() for h, e in self.models.items()},
                **self.extra}

    @property
    def target_name(self) -> str | None:
        return (self.target or {}).get("name")

    def entry(self, model_hash: str) -> ModelEntry | None:
        return self.models.get(model_hash)

    def with_model(self, model_hash: str, entry: ModelEntry) -> "Manifest":
        return replace(self, models={**self.models, model_hash: entry})

    def with_target(self, hw) -> "Manifest":
        return replace(self, target=target_identity(hw))


# ---- reading --------------------------------------------------------------------------

def load_manifest_raw(path: Path) -> dict | None:
    """The manifest of a target directory as stored, unchecked; None if there is none."""
    f = path / MANIFEST_FILE
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


def load_manifest(path: Path) -> Manifest | None:
    """:func:`load_manifest_raw`, typed: the stored manifest, unchecked, or None."""
    m = load_manifest_raw(path)
    return None if m is None else Manifest.from_json(m)


def saved_trials(tdir: Path, model_hash: str) -> int | None:
    """The trial count ``tdir``'s manifest holds for a model, as on disk; None if unread."""
    try:
        return int(json.loads((tdir / MANIFEST_FILE).read_text())["models"][model_hash]
                   ["trials"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def manifest_problems(m: Manifest | dict, path: Path, hw=None) -> tuple[list[str], list[str]]:
    """What keeps a manifest (typed, or as stored) from being used here: (version
    problems, target problems).

    Each problem is a sentence that says what was expected, what was found and what
    to do about it.
    """
    if not isinstance(m, Manifest):
        m = Manifest.from_json(m)
    f = path / MANIFEST_FILE
    version, target = [], []
    if m.schema != MANIFEST_SCHEMA or m.version != MANIFEST_VERSION:
        version.append(
            f"{f} is schema {m.schema!r} version {m.version!r}; this "
            f"tvm-fusion reads {MANIFEST_SCHEMA!r} version {MANIFEST_VERSION}. Use the "
            f"tvm-fusion that wrote it (it recorded {m.tvm_fusion!r}), or re-tune "
            "into a new log directory")
    if m.tvm != tvm.__version__:
        version.append(
            f"{f} was written with TVM {m.tvm!r}, this is TVM {tvm.__version__}. "
            "Records are not carried across TVM versions (workload hashes and schedule "
            "traces change between them, and a stale record is applied silently or not at "
            f"all), so they are refused. Install TVM {m.tvm} to deploy them, or "
            "re-tune with this TVM into a new log directory; `tvm-fusion logs validate` "
            "shows which records still replay")
    stored = m.target
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


def read_manifest(path: Path, *, expect=None, allow_other_target: bool = False,
                  fresh: bool = True) -> Manifest | None:
    """The manifest of a target directory, checked; when there is none, a fresh one
    (``fresh``) or None.

    Parameters
    ----------
    path : Path
        The target directory (``LOGS/<target>``).
    expect : HardwareTarget, optional
        The hardware the records will be used on: a manifest of another target key or
        hardware hash is refused unless ``allow_other_target``.
    allow_other_target : bool
        Use records of another target anyway.
    fresh : bool
        What a directory without a manifest gives: an empty manifest (tuning starts
        one) or None (a build reads records without one).

    Raises
    ------
    LogError
        Another manifest schema or TVM version, or (without ``allow_other_target``)
        another target.
    """
    m = load_manifest_raw(path)
    if m is None:
        return Manifest.fresh() if fresh else None
    manifest = Manifest.from_json(m)
    version, target = manifest_problems(manifest, path, expect)
    if version:
        raise LogError(version[0])
    if target and not allow_other_target:
        raise LogError(target[0])
    return manifest


# ---- writing --------------------------------------------------------------------------

def _write_atomic(path: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".manifest.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path / MANIFEST_FILE)


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


def write_manifest(path: Path, manifest: Manifest | dict) -> None:
    """Write the manifest atomically under the directory lock, merged with the one on disk.

    A crash leaves the old or the new file, whole; a second process writing the same
    directory keeps its models (see :func:`_merge_models`). ``manifest`` may be the
    JSON form: ``tune`` keeps its model's entry as a dict it updates while it searches.
    """
    if isinstance(manifest, Manifest):
        manifest = manifest.to_json()
    path.mkdir(parents=True, exist_ok=True)
    with DirLock(path, exclusive=True):
        disk = load_manifest_raw(path) or {}
        out = {**manifest, "models": _merge_models(disk.get("models", {}),
                                                   manifest.get("models", {}))}
        _write_atomic(path, out)


def add_trials(path: Path, manifest: dict, entry: dict, n: int) -> int:
    """Add ``n`` measured trials to ``entry`` (a model of ``manifest``) and save, locked.

    Both are the JSON form ``tune`` updates as it searches. Counts of other processes
    tuning the same model meanwhile are kept: the count on disk is read and incremented
    under the lock. Returns the new total (also set in ``entry``).
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
