"""Build a deployable module from tuning logs, with no tuning.

The plan is the one stored with the logs for this model (so the kernels are the ones
that were tuned); each kernel takes its best verified record, and a kernel with no
record keeps its default (unscheduled) loops and is listed with its predicted share of
the model's time. Logs of another TVM or manifest version are refused, logs of another
target unless ``allow_other_target``; unreadable database lines are skipped with one
warning.
"""

from __future__ import annotations

import contextlib

import hashlib
import importlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm import relax

from ..errors import ExportError, LogError, LoweringError
from ..family import CODE_OBJECT, family_of, strategy
from ..frontend import ImportedModel
from ..gpu.amdgpu import tir_pipeline
from ..gpu.limits import raise_on_violations
from ..gpu.rocm import require_rocm_build
from .. import config
from ..costmodel import make_cost_model
from ..schedules.default import default_cpu_schedule, default_schedule
from ..schedules.tir_check import check_scheduled
from ..kernels import KernelOptions, prepare_kernels
from ..plan import FusionPlan, PlanOptions
from ..targets import HardwareTarget, as_target
from ..tune.driver import default_cost_model
from ..tune.fallback import (DEFAULT_SEARCH_CANDIDATES, MEASURED, PREDICTED, RULE,
                             UNSCHEDULED, NoRecordPick, schedule_without_records)
from ..compat.fast_math import vectorizable_exp
from ..logs.logdb import WORKLOAD_FILE
from ..logs.dirs import content_hash, open_database
from ..logs.manifest import target_key
from ..kernels.prepack import constant_shapes, fold_prepacked, has_layout_rewrite
from ..tune.space import space_for_target, space_generator

MODULE_SCHEMA = "tvm-fusion/module"
MODULE_VERSION = 2  # 2: the sidecar records the library's size and sha256


@dataclass(frozen=True, kw_only=True)
class CompiledModel:
    """A built model: the VM executable and what went into it."""

    executable: relax.VMExecutable
    target: str
    plan: FusionPlan
    kernels: tuple[str, ...]
    untuned: tuple[str, ...]  # kernels without a tuning record
    info: dict  # the JSON sidecar written beside an exported library
    untuned_share: Mapping[str, float] = field(default_factory=dict)
    """Predicted fraction of the model's time spent in each untuned kernel."""
    schedules: Mapping[str, str] = field(default_factory=dict)
    """Kernel name -> how its schedule was chosen: ``measured`` (a verified tuning
    record), ``predicted`` (the cost model's pick, built here), ``rule default`` (the
    search space's rules, no search) or ``unscheduled`` (plain loops)."""

    def export(self, path: str | Path) -> Path:
        """Write the shared library ``path`` and its sidecar ``path`` + ``.json``.

        The sidecar records the library's size and sha256, which :func:`load_module`
        checks before loading (a truncated library would crash the process with SIGBUS).

        Raises
        ------
        ExportError
            ``path`` cannot be written (no such directory, read-only, not a directory).
        """
        path = Path(path)
        check_output_path(path)
        try:
            self.executable.export_library(str(path))
        except Exception as e:  # noqa: BLE001  (the linker's error, as TVM relays it)
            raise ExportError(f"cannot write the library {path}: "
                              f"{str(e).strip().splitlines()[-1][:300]}") from e
        info = {**self.info, "library": library_digest(path)}
        try:
            sidecar_path(path).write_text(json.dumps(info, indent=1) + "\n")
        except OSError as e:
            raise ExportError(f"cannot write {sidecar_path(path)}: {e.strerror}") from e
        return path


def check_output_path(path: Path) -> None:
    """Fail early, naming ``path``, if a library cannot be written there."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        raise ExportError(f"cannot write {path}: {path.parent} is not a writable directory "
                          f"({e.strerror}); pass -o a path in a directory you can "
                          "write") from None
    if path.is_dir():
        raise ExportError(f"cannot write {path}: it is a directory; pass -o a file name "
                          "such as model.so")


def library_digest(path: Path) -> dict:
    """Size and sha256 of a library: what its sidecar records and loading checks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"size": os.path.getsize(path), "sha256": h.hexdigest()}


def sidecar_path(lib: str | Path) -> Path:
    """Where the JSON description of an exported library lives."""
    return Path(str(lib) + ".json")


def _untuned_share(plan: FusionPlan, untuned) -> dict[str, float]:
    """Each untuned kernel's share of the plan's predicted time (by kernel name)."""
    est = {g.name: g.est_us for g in plan.groups}
    total = sum(est.values()) or 1.0
    return {n: est[n] / total for n in untuned if n in est}


def _lowering_passes(target: tvm.target.Target) -> list:
    """Relax's default pipeline after legalization and fusion, which we do ourselves."""
    kind = family_of(target).relax_backend
    backend = importlib.import_module(f"tvm.relax.backend.{kind}.pipeline")
    return backend.dataflow_lower_passes(target) + backend.finalize_passes(target)


_HOST_OPS = {"nonzero": "NonZero", "unique": "Unique"}


def _code_objects(ex, hw) -> dict | None:
    """Each device kernel of a ROCm build: registers, LDS, scratch and matrix-core
    instructions read back from its code object (None for other targets)."""
    if strategy(hw).resource_compiler != CODE_OBJECT:
        return None
    from ..gpu.amdgpu import code_object_resources
    from ..plan.gpu_resources import GpuResources
    from ..plan.gpu_terms import waves_per_simd

    mods, stack = [], [ex.mod]
    while stack:
        m = stack.pop()
        mods.append(m)
        stack.extend(m.imports)
    out = {}
    for m in mods:
        if m.kind not in ("hip", "rocm"):
            continue
        for r in code_object_resources(m.inspect_source("asm")):
            out[r.entry] = {"vgprs": r.unified_vgprs, "agprs": r.agprs, "sgprs": r.sgprs,
                            "lds_bytes": r.lds_bytes, "scratch_bytes": r.scratch_bytes,
                            "mfma": r.mfma,
                            # by the VGPR file (CDNA2: 512 per lane, 8-register granules)
                            "waves_per_simd": waves_per_simd(GpuResources(
                                schedule="compiled", kernels=1,
                                threads_per_block=r.max_workgroup_size,
                                registers_per_thread=r.unified_vgprs,
                                shared_bytes=r.lds_bytes))}
    return out


def _device_toolchain(hw):
    """Where ``hw`` is a ROCm target, link its code objects with the toolchain found here
    (Debian's device bitcode and ld.lld 17+, or a ROCm installation); else nothing."""
    if not strategy(hw).device_toolchain:
        return contextlib.nullcontext()
    from ..gpu.amdgpu import find_toolchain, toolchain

    found = find_toolchain()
    return contextlib.nullcontext() if found.missing else toolchain(found)


def _refuse_host_calls_on_gpu(model, graph, hw) -> None:
    """TVM 0.27 runs NonZero and Unique as Python functions over numpy
    (``relax.run.nonzero``, ``relax.run.unique``) that return a host tensor: on a GPU
    the kernels reading it would get host memory. Refuse such a build by name."""
    users = graph.consumers()
    for node in graph.nodes:
        if node.library and node.op in _HOST_OPS and users[node.id]:
            onnx_nodes = [n.name or n.output[0] for n in model.onnx_model.graph.node
                          if n.op_type.lower() == node.op]
            raise LoweringError(
                f"{node.op}#{node.id} (ONNX {_HOST_OPS[node.op]} node(s) "
                f"{', '.join(map(repr, onnx_nodes[:5]))} of {model.source}) runs on the "
                f"host in TVM {tvm.__version__} (a numpy function returning a host tensor), "
                f"and kernels on {hw.name} read its result: compile for a CPU target, or run "
                "that op and what follows it outside the model", kernel=node.op)


def _lower_library_ops(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's own lowering of the plan's library nodes for ``target``: sort and scan ops
    (topk, sort, cumsum...) to its TOPI kernels (DispatchSortScan: GPU kernels on GPU
    targets), sampling ops likewise; runtime calls (nonzero, unique) are left as they are."""
    kind = family_of(target).relax_backend
    backend = importlib.import_module(f"tvm.relax.backend.{kind}.pipeline")
    return tvm.transform.Sequential(backend.library_dispatch_passes(target))(mod)


# Relax kernels whose ONNX op type is not their name with the underscores dropped
_ONNX_OP_TYPE = {"all_class_non_max_suppression": "NonMaxSuppression",
                 "cumsum": "CumSum", "gpu_2d_continuous_cumsum": "CumSum"}


def _lowering_advice(model, graph, plan, hw, err: LoweringError) -> str:
    """``err``'s message with the ONNX op and nodes of the kernel and what to do."""
    group = next((g for g in plan.groups if g.name == err.kernel), None)
    ops = [graph.nodes[n].op for n in group.nodes] if group else [err.kernel]
    types = {_ONNX_OP_TYPE.get(op, op.replace("_", "").rstrip("0123456789")) for op in ops}
    nodes = [n for n in model.onnx_model.graph.node
             if n.op_type in types or n.op_type.lower() in types]
    what = (", ".join(sorted({n.op_type for n in nodes})) + " node(s) "
            + ", ".join(repr(n.name or n.output[0]) for n in nodes[:5])) if nodes else (
        f"operator(s) {', '.join(ops)}")
    return (f"{err} (the {what} of {model.source}). TVM {tvm.__version__} has no "
            f"{hw.family} lowering of it: compile for a CPU target (host, x86_avx512), "
            "where TVM lowers it, or take it out of the model and run it on the outputs "
            "(e.g. NonMaxSuppression in post-processing)")


def _scheduled(func: tvm.tirx.PrimFunc) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.is_scheduled", False))


def _base_name(name: str) -> str:
    """A kernel's name before ``fold_prepacked`` renamed it ``K_prepacked``."""
    return name.removesuffix("_prepacked")


def _schedule_no_record(mod, target, hw, plan, mode: str, budget: int, progress):
    """CPU kernels without a record scheduled with no measurement
    (:func:`~tvm_fusion.tune.fallback.schedule_without_records`); int8 GEMMs and convs
    take their VNNI default first. Returns the module and kernel -> NoRecordPick."""
    if mode not in ("auto", "rules", "none"):
        raise ValueError(f"no_record must be 'auto', 'rules' or 'none', got {mode!r}")
    before = {n for n, f in _prim_funcs(mod).items() if _scheduled(f)}
    mod = default_cpu_schedule(mod, target)  # int8 on VNNI: a rule of its own
    picks = {n: NoRecordPick(kind=RULE, note="VNNI int8 schedule")
             for n, f in _prim_funcs(mod).items() if _scheduled(f) and n not in before}
    if mode == "none":
        return mod, picks
    cost_model = None
    path = default_cost_model(hw) if mode == "auto" else None
    if path is not None:
        with warnings.catch_warnings():  # a neighbour CPU's model: ranking only, no warning
            warnings.simplefilter("ignore")
            cost_model = make_cost_model(path, hw, update_rounds=0)
    space = space_for_target(target)
    est = {g.name: g.est_us for g in plan.groups}
    mod, more = schedule_without_records(
        mod, target, space_generator=space_generator(space, target), cost_model=cost_model,
        search_candidates=budget if cost_model is not None else 0, shares=est,
        progress=progress)
    return mod, {**picks, **more}


def _schedule_kind(name: str, measured, picks, rules_used) -> str:
    base = _base_name(name)
    if base in measured:
        return MEASURED
    if base in picks:
        return picks[base].kind
    return RULE if name in rules_used else UNSCHEDULED  # GPU: dlight's rules


def _prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)}


def compile_model(model: ImportedModel, target: str | HardwareTarget = "host", *,
                  logs: str | Path | None = None, plan: FusionPlan | None = None,
                  plan_options: PlanOptions = PlanOptions(),
                  allow_other_target: bool = False,
                  no_record: str | None = None,
                  no_record_budget: int = DEFAULT_SEARCH_CANDIDATES,
                  progress=None) -> CompiledModel:
    """Build ``model`` for ``target`` from the records in ``logs``.

    Parameters
    ----------
    model : ImportedModel
    target : str or HardwareTarget
    logs : path, optional
        A log directory written by :func:`~tvm_fusion.tune`. Missing or empty: every
        kernel gets its default schedule.
    plan : FusionPlan, optional
        Overrides the plan stored in the logs.
    plan_options : PlanOptions
        How a fresh plan (neither ``plan`` nor a stored plan is there) partitions and
        lays out the model: planner, layout, combine, resources, group_model; a stored
        or given plan keeps its own. ``prepack``: apply records of kernels tuned with
        prepacked weights, and pack those weights into the module at build (see
        :func:`~tvm_fusion.tune`). Default: what the model's manifest entry was tuned
        with (an entry from before prepacking: off), else on for CPU targets. Asking
        for the other setting than the entry's raises
        :class:`~tvm_fusion.errors.LogError` (none of its records would apply).
    allow_other_target : bool
        Use logs whose manifest names another target key or hardware hash.
    no_record : str, optional
        CPU kernels without a record (:mod:`tvm_fusion.tune.fallback`); default
        ``$TVM_FUSION_NO_RECORD``, else ``auto``: the shipped cost model's pick from a
        short search while ``no_record_budget`` lasts (largest predicted share first),
        the rules' default schedule after it or without a model; ``rules``: rule
        defaults only; ``none``: plain loops (for comparison). The same model, logs,
        target and cost model always give the same schedules.
        GPU kernels without a record always get dlight's default rules.
    no_record_budget : int
        Cost-model search candidates over all kernels without a record
        (``tune.fallback.SEARCH_POPULATION`` per kernel searched); a count, not seconds,
        so that builds do not depend on the machine's load. 0: rule defaults only.
    progress : callable, optional
        Called with one line of text per kernel scheduled without a record.

    Returns
    -------
    CompiledModel

    Raises
    ------
    LogError
        The logs were written by another TVM or manifest version, or (without
        ``allow_other_target``) for another target.

    Notes
    -----
    Calls :func:`tvm_fusion.config.use_all_cores` first, so that the module it returns
    (and the kernels timed while it builds) run on every core.
    """
    config.use_all_cores()  # before the first kernel runs: TVM's default is half the cores
    hw = as_target(target)
    if strategy(hw).device_toolchain:  # say what is missing before any work, not deep in codegen
        require_rocm_build(hw)
    tvm_target = hw.tvm_target()
    kernels = prepare_kernels(model, hw, logs, KernelOptions(
        plan=plan, plan_options=plan_options, allow_other_target=allow_other_target,
        before_simplify="warn"))
    model, entry, graph, plan = kernels.model, kernels.entry, kernels.graph, kernels.plan
    tdir, prepack = kernels.tdir, kernels.prepack
    if tdir is not None and kernels.manifest is None and (tdir / WORKLOAD_FILE).exists():
        warnings.warn(f"{tdir} has tuning records but no manifest.json, so their TVM "
                      "version and target cannot be checked; they are applied as they "
                      "are", stacklevel=2)
    if not strategy(hw).host_calls:
        _refuse_host_calls_on_gpu(model, graph, hw)
    mod = kernels.mod
    db = open_database(tdir, create=False) if logs else None
    with tvm_target, tvm.transform.PassContext(opt_level=3):
        if db is not None:
            with db:
                mod = relax.transform.MetaScheduleApplyDatabase()(mod)
        measured = {n for n, f in _prim_funcs(mod).items() if _scheduled(f)}
        picks = {}
        if not strategy(hw).dlight_default:
            mod, picks = _schedule_no_record(mod, tvm_target, hw, plan,
                                             no_record or config.NO_RECORD.get(),
                                             no_record_budget, progress)
        packed = sorted(n for n, f in _prim_funcs(mod).items() if has_layout_rewrite(f))
        mod = fold_prepacked(mod)  # the packed weights become the module's constants
        packed = constant_shapes(mod, packed)
        mod = _lower_library_ops(mod, tvm_target)
        funcs = _prim_funcs(mod)
        untuned = tuple(sorted(n for n in funcs if _base_name(n) not in measured))
        rules_used = {}
        mod = default_schedule(mod, tvm_target, hw, rules_used=rules_used)  # GPU: dlight
        if strategy(hw).checks_kernel_limits:
            try:
                raise_on_violations(check_scheduled(mod, hw))
            except LoweringError as e:
                raise LoweringError(_lowering_advice(model, graph, plan, hw, e),
                                    kernel=e.kernel) from e
            funcs = _prim_funcs(mod)
        lower = tvm.transform.Sequential(_lowering_passes(tvm_target))
        try:
            with vectorizable_exp(), _device_toolchain(hw):  # the lowering the tuner measured
                ex = relax.build(lower(mod), target=tvm_target, relax_pipeline=None,
                                 tir_pipeline=tir_pipeline(tvm_target))
        except Exception as e:
            raise LogError(f"building {model.source} for {hw.name} failed: "
                           f"{str(e).splitlines()[-1]}") from e
    # a record of `tune --dry-run` (picked by the cost model, never run) is no measurement
    unmeasured = entry.unmeasured if entry is not None else frozenset()
    schedules = {n: PREDICTED if _base_name(n) in unmeasured and _base_name(n) in measured
                 else _schedule_kind(n, measured, picks, rules_used) for n in sorted(funcs)}
    info = {
        "schema": MODULE_SCHEMA, "version": MODULE_VERSION, "tvm": tvm.__version__,
        "source": model.source, "model_hash": model.model_hash, "target": hw.name,
        "tvm_target": json.loads(json.dumps(hw.tvm_config, default=dict)), "plan_hash": plan.hash,
        "layout": plan.layout,
        "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
                   for t in model.inputs],
        "consts": {n: v.tolist() for n, v in model.consts.items()},
        "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
                    for t in model.outputs],
        "kernels": sorted(funcs), "untuned": list(untuned),
        # how each kernel's schedule was chosen: measured, predicted, rule default, unscheduled
        "schedules": schedules,
        # why a kernel without a record got the kind it got (a rejected pick, no rule)
        "schedule_notes": {n: p.note for n, p in sorted(picks.items()) if p.note},
        # kernels reading weights packed at build: the packed constants' shapes
        "prepack": prepack, "prepacked": packed,
        "untuned_est_share": _untuned_share(plan, untuned),
        # picked by the cost model on a machine without the device: neither run nor verified
        "predicted_unmeasured": sorted(unmeasured),
        # gfx90a: what the AMDGPU backend allocated for each kernel of the code object
        "code_objects": _code_objects(ex, hw),
        "logs": None if db is None else {
            "content_hash": content_hash(tdir), "target_key": target_key(hw.tvm_config),
            "model_in_manifest": entry is not None,
            "records": len(db), "skipped_lines": len(db.bad_lines)},
    }
    return CompiledModel(executable=ex, target=hw.name, plan=plan,
                         kernels=tuple(sorted(funcs)), untuned=untuned, info=info,
                         untuned_share=info["untuned_est_share"], schedules=schedules)
