"""Offline measurement: build candidates here, time them on a device TVM cannot reach.

For a device that can run a compiled module but is not reachable through TVM's RPC
tracker (an air-gapped box, a lent GPU machine without TVM's compiler, a device whose
Python differs from ours): :func:`export_bundle` builds, on this machine, every model
(each plan, default schedules) and, per kernel, the default schedule plus schedules
drawn from the target's design space, into a directory of shared libraries with the
reference data to check them. ``runner.py`` (TVM's runtime and numpy only)
runs on the device (it reads ``device.json``; ``bundle.json`` stays here), checks every build and times it. :func:`import_measurements` turns
the verified timings into ordinary tuning records in ``LOGS/<target>/``, from which
``compile`` builds with no tuning.

Checks, end to end: a model is compared with ONNX Runtime (outputs computed here); a
kernel's default schedule with the unscheduled kernel run on this machine's CPU (seed
0); every candidate with the default on three seeds, on the device. A candidate that
fails any check never becomes a record, nor does one within noise of the default or one
that breaks the target's limits (``schedules.tir_check``, which ``compile`` enforces).
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import tempfile
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

from ..deploy.build import compile_model
from ..family import family_of, strategy
from ..gpu.sample import sample_schedules
from ..schedules.default import default_schedule
from ..schedules.tir_check import check_scheduled
from ..kernels import KernelOptions, prepare_kernels
from ..plan import FusionPlan, PlanOptions
from ..reference import random_inputs, run_onnxruntime
from ..targets import as_target, load_target
from ..compat.fast_math import vectorizable_exp
from ..logs.logdb import dumps, record_json
from ..logs.dirs import open_database, target_dir
from ..logs.manifest import KernelUse, ModelEntry, read_manifest, write_manifest
from ..tune.measure import NEAR_TIE, MeasureError
from ..kernels.prepack import resolve_prepack
from ..tune.verify import _buffers, quantizes, run_kernel

BUNDLE_SCHEMA = "tvm-fusion/offline-bundle"
BUNDLE_VERSION = 1
RESULTS_FILE = "results.jsonl"
SEEDS = (0, 1, 2)  # as tune's verification (verify.VERIFY_SEEDS)


@dataclass(frozen=True)
class ImportSummary:
    """What :func:`import_measurements` did.

    Attributes
    ----------
    records : int
        Verified candidates written as records.
    kernels_improved : int
        Kernels whose best verified candidate beat the default schedule.
    rejected : dict
        Kernel name -> number of candidates that failed a check (error, or outputs
        that differ from the default).
    models : dict
        Model label -> the device's result (``max_rel_error``, ``median_ms``, ...).
    """

    records: int
    kernels_improved: int
    rejected: dict
    models: dict


def _device_kind(tvm_target: tvm.target.Target) -> str:
    return family_of(tvm_target).device_type


def _params(func: tvm.tirx.PrimFunc) -> list[list]:
    return [[[int(d) for d in b.shape], str(b.dtype)] for b in func.params]


def _default_schedule(wl: tvm.IRModule, tvm_target, hw) -> tvm.tirx.PrimFunc:
    """What ``compile`` uses for a kernel without a record."""
    return default_schedule(wl, tvm_target, hw)["main"]


def _build(funcs: dict, tvm_target) -> tvm.runtime.Module | None:
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with vectorizable_exp():  # the lowering compile uses
        return tvm.tirx.build(mod, target=tvm_target)


def _build_kernel(funcs: dict, tvm_target) -> tuple[tvm.runtime.Module, list[str], dict]:
    """Build ``funcs`` into one library; a function that does not build is dropped."""
    try:
        return _build(funcs, tvm_target), list(funcs), {}
    except Exception:  # noqa: BLE001  (find the culprit one by one)
        pass
    good, bad = {}, {}
    for name, f in funcs.items():
        try:
            _build({name: f}, tvm_target)
            good[name] = f
        except Exception as e:  # noqa: BLE001
            bad[name] = str(e).strip().splitlines()[-1][:300] if str(e).strip() else repr(e)
    if not good:
        raise MeasureError(f"no schedule of this kernel builds: {bad}")
    return _build(good, tvm_target), list(good), bad


def _cpu_reference(wl: tvm.IRModule, seed: int) -> dict[int, np.ndarray]:
    """Buffers the unscheduled kernel writes, run on this machine's CPU: index -> array."""
    after, _ = run_kernel(wl, tvm.target.Target("llvm"), seeds=(seed,))
    before = _buffers(wl["main"], seed)
    return {i: a for i, (a, b) in enumerate(zip(after, before)) if not np.array_equal(a, b)}


def _checksum(func: tvm.tirx.PrimFunc, seed: int) -> float:
    """A number the device recomputes to confirm it draws the same random buffers."""
    return float(sum(np.asarray(b, np.float64).sum() for b in _buffers(func, seed)))


def export_bundle(models, target, out: str | os.PathLike, *, plans=("cost", "fuseops"),
                  tune_plan: str = "cost", candidates: int = 16, seed: int = 0,
                  logs: str | os.PathLike | None = None, progress=print,
                  prepack: bool | None = None) -> Path:
    """Build what a device should run and time into the directory ``out``.

    Parameters
    ----------
    models : sequence of ImportedModel
    target : str or HardwareTarget
    out : path
        Created if need be; the files of an earlier bundle there are overwritten.
    plans : sequence of str
        Planners whose whole-model builds (default schedules) are timed on the device.
    tune_plan : str
        The planner whose kernels get candidates (the plan a later ``compile`` uses).
    candidates : int
        Schedules drawn per kernel from the target's design space (MetaSchedule's
        postprocessors, ``VerifyGPUCode`` among them, already applied). 0: models only.
    seed : int
    logs : path, optional
        Also build each model from these tuning logs (label ``<model>.tuned``), to time
        it beside the default-schedule builds in the same run.
    progress : callable
        Called with one line per built item.
    prepack : bool, optional
        Draw the kernels' candidates with their constant weights layout-free, as
        ``tune`` does (default: on for CPU targets); the imported records say so.

    Returns
    -------
    Path
        ``out``; its ``bundle.json`` says what is there.
    """
    hw = as_target(target)
    prepack = resolve_prepack(prepack, None, hw, where=out)
    tvm_target = hw.tvm_target()
    out = Path(out)
    for sub in ("models", "kernels"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FILE).unlink(missing_ok=True)
    bundle = {"schema": BUNDLE_SCHEMA, "version": BUNDLE_VERSION, "tvm": tvm.__version__,
              "target": hw.name, "device": _device_kind(tvm_target),
              "tvm_target": json.loads(json.dumps(hw.tvm_config, default=dict)),
              "seeds": list(SEEDS), "models": [], "kernels": []}
    seen = {}
    stems: set[str] = set()
    for model in models:
        inputs = random_inputs(model.inputs)
        want = run_onnxruntime(model.onnx_model, inputs)
        stem = _file_stem(model, stems)
        data = out / "models" / f"{stem}.npz"
        np.savez_compressed(data, **{f"in{i}": a for i, a in enumerate(inputs)},
                            **{f"out{i}": a for i, a in enumerate(want)})
        tuned_plan = None
        for planner in plans:
            plan, tasks = _kernels(model, hw, planner, prepack)
            entry = _export_model(compile_model(model, hw, plan=plan), model, planner,
                                  out, data, len(inputs), len(want), stem)
            bundle["models"].append(entry)
            progress(f"{entry['label']}: {entry['kernels']} kernels")
            if planner == tune_plan:
                tuned_plan = (plan, tasks)
        if logs is not None:
            entry = _export_model(compile_model(model, hw, logs=logs), model, "tuned", out,
                                  data, len(inputs), len(want), stem)
            bundle["models"].append(entry)
            progress(f"{entry['label']}: {entry['kernels']} kernels, {entry['untuned']} "
                     "with the default schedule")
        if candidates <= 0:
            continue
        if tuned_plan is None:
            tuned_plan = _kernels(model, hw, tune_plan, prepack)
        plan, tasks = tuned_plan
        bundle.setdefault("plans", {})[model.model_hash] = {
            "source": model.source, "plan": plan.to_json(),
            "inputs": {t.name: list(t.shape) for t in model.inputs},
            "prepack": prepack, "tasks": []}
        for task in tasks:
            wl = task.dispatched[0]
            key = ms.database.Workload(wl).as_json()[0]  # MetaSchedule's workload hash
            if key in seen:
                seen[key]["models"].append(model.source)
                bundle["plans"][model.model_hash]["tasks"].append(
                    [task.task_name, int(task.weight), seen[key]["lib"]])
                continue
            entry = _export_kernel(wl, task.task_name, len(bundle["kernels"]), hw,
                                   tvm_target, out, candidates, seed, sample_schedules)
            entry["models"] = [model.source]
            seen[key] = entry
            bundle["kernels"].append(entry)
            bundle["plans"][model.model_hash]["tasks"].append(
                [task.task_name, int(task.weight), entry["lib"]])
            progress(f"  {task.task_name}: {len(entry['candidates'])} candidates"
                     + (f", {len(entry['unbuildable'])} did not build"
                        if entry["unbuildable"] else ""))
    (out / "bundle.json").write_text(json.dumps(bundle, indent=1))
    write_device_manifest(out)
    return out


def _kernels(model, hw, planner: str, prepack: bool):
    """(plan, tasks) of ``model``: NCHW, with the parallel matmuls the planner combines
    (:mod:`tvm_fusion.plan.combine`; ``compile`` rebuilds that graph from the plan). A
    cost plan for a GPU is made again with the compiler's registers and shared memory
    where the compiler is here (:func:`tvm_fusion.gpu.resources.plan_resources`); the
    baseline planners' plans are stock TVM's, left as they are."""
    kernels = prepare_kernels(model, hw, None, KernelOptions(
        plan_options=PlanOptions(planner=planner, layout="nchw", prepack=prepack,
                                 resources="auto" if planner == "cost" else "estimated"),
        schedulable=True))
    return kernels.plan, kernels.tasks


def write_device_manifest(out: str | os.PathLike, *, skip_models=()) -> Path:
    """``device.json``: the part of ``bundle.json`` the device reads (no workloads or
    traces, which only :func:`import_measurements` needs); ``skip_models`` leaves model
    builds out (say, ones whose embedded weights are too large to ship)."""
    out = Path(out)
    bundle = json.loads((out / "bundle.json").read_text())
    slim = {k: v for k, v in bundle.items() if k not in ("kernels", "plans", "models")}
    slim["models"] = [m for m in bundle["models"] if m["source"] not in skip_models
                      and m["label"] not in skip_models]
    slim["kernels"] = [{k: v for k, v in kern.items() if k not in ("workload", "records")}
                       for kern in bundle["kernels"]]
    (out / "device.json").write_text(json.dumps(slim))
    return out / "device.json"


def _file_stem(model, taken: set[str]) -> str:
    """A file name for ``model`` inside the bundle, whatever path it was read from.

    ``model.source`` may be ``dir/model.onnx`` or absolute: used as a file name it would
    write outside the bundle. Two models of one name get the model hash appended.
    """
    name = Path(model.source).name.removesuffix(".onnx")
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".")
    stem = stem or "model"
    if stem in taken:
        stem = f"{stem}-{model.model_hash[:8]}"
    taken.add(stem)
    return stem


def _export_model(compiled, model, planner, out, data, n_in, n_out, stem) -> dict:
    """Write one whole-model build; its entry in ``bundle.json``."""
    label = f"{model.source}.{planner}"
    lib = out / "models" / f"{stem}.{planner}.so"
    compiled.executable.export_library(str(lib))
    return {"label": label, "source": model.source, "model_hash": model.model_hash,
            "planner": planner, "plan_hash": compiled.plan.hash,
            "kernels": len(compiled.kernels), "untuned": len(compiled.untuned),
            "lib": str(lib.relative_to(out)), "data": str(data.relative_to(out)),
            "inputs": n_in, "outputs": n_out}


def _export_kernel(wl, name, index, hw, tvm_target, out, count, seed, sample_schedules
                   ) -> dict:
    """One library per kernel (``default`` + ``c0``..): one build (one nvcc/NVRTC run on
    the device, where CUDA source is compiled at load) instead of one per schedule."""
    func = wl["main"]
    schs = sample_schedules(func, hw, count=count, seed=seed)
    funcs = {"default": _default_schedule(wl, tvm_target, hw)}
    records = {}
    workload = ms.database.Workload(wl)
    for j, sch in enumerate(schs):
        cname = f"c{j}"
        funcs[cname] = sch.mod["main"]
        rec = ms.database.TuningRecord(
            trace=sch.trace, workload=workload, run_secs=None, target=tvm_target,
            args_info=ms.arg_info.ArgInfo.from_entry_func(sch.mod, True))
        records[cname] = record_json(rec)
    lib, built, bad = _build_kernel(funcs, tvm_target)
    path = out / "kernels" / f"k{index:03d}.so"
    lib.export_library(str(path))
    ref = _cpu_reference(wl, SEEDS[0])
    refpath = out / "kernels" / f"k{index:03d}.ref.npz"
    np.savez_compressed(refpath, **{f"b{i}": a for i, a in ref.items()})
    return {"task": name, "lib": str(path.relative_to(out)),
            "ref": str(refpath.relative_to(out)), "params": _params(func),
            "quantizes": quantizes(func),
            "checksum": _checksum(func, SEEDS[0]),
            "workload": json.loads(dumps(workload.as_json())),
            "candidates": [c for c in built if c != "default"],
            "default_built": "default" in built,
            "records": {c: records[c] for c in built if c != "default"},
            "unbuildable": bad}


def read_results(bundle_dir: str | os.PathLike) -> tuple[dict, dict]:
    """The device's results: (model label -> result, kernel lib -> result)."""
    path = Path(bundle_dir) / RESULTS_FILE
    if not path.exists():
        raise MeasureError(f"{path} does not exist: run tvm_fusion/offline/runner.py on the device "
                           "with this bundle, and copy its results.jsonl here")
    models, kernels = {}, {}
    bad = []
    text = path.read_bytes().decode("utf-8", errors="replace")  # bad bytes: a bad line
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(lineno)  # a line cut short when the device died mid-write
            continue
        key = {"model": "label", "kernel": "lib"}.get(
            row.get("kind") if isinstance(row, dict) else None)
        if key is None or not isinstance(row.get(key), str):
            bad.append(lineno)
            continue
        (models if key == "label" else kernels)[row[key]] = row
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        warnings.warn(f"{path}: skipped {len(bad)} line(s) that are not a result the runner "
                      f"writes (line {shown}); re-run runner.py on the device to measure "
                      "what they held", stacklevel=2)
    return models, kernels


TAR_FIX = ("a bundle archive holds the bundle's regular files and directories only: "
           "export the bundle again and pack its directory (tar czf B.tar.gz B)")


@contextmanager
def unpacked_bundle(path: str | os.PathLike) -> Iterator[Path]:
    """The bundle directory at ``path``: itself, or a tar archive's, extracted safely.

    An archive is untrusted: it is extracted with tarfile's ``data`` filter into a
    temporary directory (removed on exit), after refusing any member that is not a
    regular file or a directory (links, devices, FIFOs) or has an absolute name, so
    nothing is written outside that directory.

    Parameters
    ----------
    path : path
        A bundle directory, or a ``.tar`` / ``.tar.gz`` of one (``bundle.json`` at its
        top or in its one top-level directory).

    Yields
    ------
    Path
        The directory holding ``bundle.json``.

    Raises
    ------
    MeasureError
        A path that is neither; an archive that cannot be read, is cut short, or has a
        member refused (named, with why).
    """
    path = Path(path)
    if path.is_dir():
        yield path
        return
    if not path.is_file():
        raise MeasureError(f"offline bundle {path}: no such directory or file; pass the "
                           "directory `tvm-fusion offline export -o` wrote, or a tar of it")
    with tempfile.TemporaryDirectory(prefix="tvm-fusion-bundle-") as tmp:
        yield _bundle_root(_extract(path, Path(tmp)), path)


def _extract(archive: Path, dest: Path) -> Path:
    """Every member of ``archive`` into ``dest``, each checked before it is written."""
    try:
        tar = tarfile.open(archive)  # any compression tarfile reads
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        raise MeasureError(f"offline bundle {archive} is not a tar archive (plain, gzip, "
                           "bzip2 or xz); pass the bundle directory or a tar of it") from None
    with tar:
        if not hasattr(tarfile, "data_filter"):
            version = sys.version.split()[0]
            raise MeasureError(f"offline bundle {archive}: this Python ({version}) has "
                               "no tarfile extraction filter (3.10.12, 3.11.4 and later "
                               "have it), so an archive is not extracted here; extract it "
                               "yourself and pass the bundle directory")
        member = None
        try:
            while (member := tar.next()) is not None:
                tar.extract(member, dest, filter=_bundle_filter)
        except _FILTER_ERROR as e:
            raise MeasureError(f"offline bundle {archive}: {e}; refused, {TAR_FIX}") from None
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            after = f" at member {member.name!r}" if member is not None else ""
            why = " ".join(str(e).split())  # one line
            raise MeasureError(f"offline bundle {archive} is damaged or cut short{after} "
                               f"({why}); copy the archive again") from None
    return dest


# tarfile's filters (and FilterError) came in 3.10.12 / 3.11.4: an older Python still
# imports this module (export, import of a directory) and refuses archives above
_FILTER_ERROR = getattr(tarfile, "FilterError", tarfile.TarError)


class _NotAFileError(_FILTER_ERROR):
    """A link, device or FIFO: no bundle holds one (and links are where tarfile's data
    filter was bypassed before 3.11.13, CVE-2025-4517)."""

    def __init__(self, tarinfo: tarfile.TarInfo, kind: str):
        self.tarinfo = tarinfo
        super().__init__(f"member {tarinfo.name!r} is {kind}")


def _bundle_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter, after refusing what a bundle never holds."""
    if member.name.startswith(("/", os.sep)):  # the data filter strips it: refuse it
        raise tarfile.AbsolutePathError(member)
    if member.issym() or member.islnk():
        kind = "a symbolic link" if member.issym() else "a hard link"
        raise _NotAFileError(member, f"{kind} to {member.linkname!r}")
    if not (member.isreg() or member.isdir()):
        raise _NotAFileError(member, "a device or FIFO, not a file")
    return tarfile.data_filter(member, dest)


def _bundle_root(dest: Path, archive: Path) -> Path:
    """The directory of ``bundle.json`` in an extracted archive: its top or its one
    top-level directory."""
    if (dest / "bundle.json").is_file():
        return dest
    tops = [p for p in dest.iterdir() if p.is_dir() and (p / "bundle.json").is_file()]
    if len(tops) != 1:
        raise MeasureError(f"offline bundle {archive} has no bundle.json at its top or in "
                           f"one top-level directory; {TAR_FIX}")
    return tops[0]


def _read_bundle(bundle_dir: Path) -> dict:
    """``bundle.json``, checked to be one of this tvm-fusion and TVM."""
    try:
        bundle = json.loads((bundle_dir / "bundle.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MeasureError(f"{bundle_dir / 'bundle.json'} cannot be read ({e}); pass a "
                           "directory written by `tvm-fusion offline export`") from None
    if not isinstance(bundle, dict) or bundle.get("schema") != BUNDLE_SCHEMA or \
            bundle.get("tvm") != tvm.__version__:
        got = bundle if isinstance(bundle, dict) else {}
        raise MeasureError(f"{bundle_dir} is not a bundle of this tvm-fusion and TVM "
                           f"{tvm.__version__} (schema {got.get('schema')!r}, TVM "
                           f"{got.get('tvm')!r}); export it again")
    return bundle


def import_measurements(bundle_dir: str | os.PathLike, logs: str | os.PathLike, *,
                        results: str | os.PathLike | None = None, keep: int = 4
                        ) -> ImportSummary:
    """Write the device's verified timings of a bundle as records in ``logs/<target>``.

    Parameters
    ----------
    bundle_dir : path
        A bundle from :func:`export_bundle`, or a tar archive of one (extracted safely
        into a temporary directory, see :func:`unpacked_bundle`).
    logs : path
        Log directory (created); the records go to ``logs/<target>/``, the plans to its
        manifest, as ``tune`` writes them.
    results : path, optional
        Directory holding the device's ``results.jsonl`` (default: ``bundle_dir``).
    keep : int
        Best verified candidates kept per kernel (all that beat the default count).

    Returns
    -------
    ImportSummary
    """
    name = Path(bundle_dir).name.split(".tar")[0].removesuffix(".tgz")
    with unpacked_bundle(bundle_dir) as where:
        return _import_measurements(where, name, logs, results, keep)


def _import_measurements(bundle_dir: Path, name: str, logs, results, keep: int
                         ) -> ImportSummary:
    """:func:`import_measurements` of a bundle directory (``name``: what the manifest
    calls it)."""
    bundle = _read_bundle(bundle_dir)
    hw = load_target(bundle["target"])
    models, kernels = read_results(results or bundle_dir)
    tdir = target_dir(logs, hw.name)
    tdir.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(tdir, expect=hw).with_target(hw)
    for model_hash, p in bundle.get("plans", {}).items():  # before any record is written
        entry = manifest.entry(model_hash)
        if entry is not None and entry.plan_hash == p["plan"]["hash"]:
            resolve_prepack(bool(p.get("prepack", False)), entry, hw, where=tdir)
    db = open_database(tdir, create=True)
    # every verified timing, as tune's candidates/ (what `cost-model train` reads)
    cand_db = open_database(tdir / "candidates", create=True)
    n_rec, improved, rejected = 0, 0, {}
    # a kernel's workload key is MetaSchedule's hash, the first field of its JSON; only
    # kernels that get a record have their workload (1-500 KB of TIR each) written
    keys = {k["lib"]: k["workload"][0] for k in bundle["kernels"]}
    for k in bundle["kernels"]:
        row = kernels.get(k["lib"])
        if row is None or row.get("default_error"):
            continue  # not run, or its default failed: nothing here can be trusted
        wl = ms.database.Workload.from_json(k["workload"])
        cwl = None
        for cand, c in row["candidates"].items():
            if c.get("verified"):
                cwl = cwl or cand_db.commit_workload(wl.mod)
                obj = list(k["records"][cand])
                obj[1] = [float(t) for t in c["run_secs"]]
                cand_db.commit_tuning_record(ms.database.TuningRecord.from_json(obj, cwl))
        default_s = row["default_us"] / 1e6
        ok = [(c["median_us"], cand, c) for cand, c in row["candidates"].items()
              if c.get("verified")]
        rejected[k["task"]] = sum(1 for c in row["candidates"].values()
                                  if not c.get("verified"))
        ok.sort(key=lambda x: x[0])
        # as tune: a candidate within measurement noise of the default loops is no better
        beat = [x for x in ok if x[0] / 1e6 < default_s * (1 - NEAR_TIE)]
        kept = 0
        for _, cand, c in beat:
            obj = list(k["records"][cand])
            obj[1] = [float(s) for s in c["run_secs"]]
            rec = ms.database.TuningRecord.from_json(obj, wl)
            if _violations(rec, wl, hw):  # compile would refuse it, as tune's check does
                rejected[k["task"]] += 1
                continue
            wl = db.commit_workload(wl.mod)
            db.commit_tuning_record(ms.database.TuningRecord.from_json(obj, wl))
            n_rec, kept = n_rec + 1, kept + 1
            if kept == keep:
                break
        improved += bool(kept)
    stored = {db.workload_key(w) for w in db.workloads()}  # the records are all in now
    for model_hash, p in bundle.get("plans", {}).items():
        n = sum(len(kernels[k["lib"]]["candidates"]) for k in bundle["kernels"]
                if p["source"] in k["models"] and k["lib"] in kernels)
        if n == 0:
            continue  # none of its kernels ran on the device
        plan = FusionPlan.from_json(p["plan"])
        entry = manifest.entry(model_hash)
        if entry is None or entry.plan_hash != plan.hash:
            entry = ModelEntry(source=p["source"], trials=0, plan=plan.to_json(),
                               inputs={k: tuple(v) for k, v in p["inputs"].items()})
        entry = replace(
            entry, trials=entry.trials + n,
            prepack=True if p.get("prepack", False) else entry.prepack,
            # the kernels with a record (``logs show`` / ``prune`` read which model uses
            # which)
            kernels={name: KernelUse(workload=keys[lib], calls=calls)
                     for name, calls, lib in p["tasks"] if keys[lib] in stored},
            extra={**entry.extra, "offline": {"bundle": name,
                                              "device": _device_name(models)}})
        manifest = manifest.with_model(model_hash, entry)
    write_manifest(tdir, manifest)
    return ImportSummary(records=n_rec, kernels_improved=improved, rejected=rejected,
                         models=models)


def _violations(rec, wl, hw) -> list[str]:
    """The target's limits a record's schedule breaks (GPU targets; see schedules.tir_check)."""
    if not strategy(hw).checks_kernel_limits:
        return []

    sch = tvm.s_tir.Schedule(wl.mod)
    rec.trace.apply_to_schedule(sch, remove_postproc=False)
    mod = tvm.IRModule({"main": sch.mod["main"].with_attr("tirx.is_scheduled", True)})
    return [v for vs in check_scheduled(mod, hw).values() for v in vs]


def _device_name(models: dict) -> str | None:
    for row in models.values():
        if row.get("device_name"):
            return row["device_name"]
    return None
