"""Build a deployable module from tuning logs, with no tuning.

The plan is the one stored with the logs for this model (so the kernels are the ones
that were tuned); each kernel takes its best verified record, and a kernel with no
record keeps its default (unscheduled) loops and is listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import relax

from ..errors import LogError
from ..frontend import ImportedModel
from ..graph import build_graph
from ..plan import FusionPlan, apply_plan, make_plan
from ..targets import HardwareTarget, load_target
from ..tune.logs import open_database, read_manifest, target_dir

MODULE_SCHEMA = "tvm-fusion/module"
MODULE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class CompiledModel:
    """A built model: the VM executable and what went into it."""

    executable: relax.VMExecutable
    target: str
    plan: FusionPlan
    kernels: tuple[str, ...]
    untuned: tuple[str, ...]  # kernels built with their default schedule
    info: dict  # the JSON sidecar written beside an exported library

    def export(self, path: str | Path) -> Path:
        """Write the shared library ``path`` and its sidecar ``path`` + ``.json``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.executable.export_library(str(path))
        sidecar_path(path).write_text(json.dumps(self.info, indent=1) + "\n")
        return path


def sidecar_path(lib: str | Path) -> Path:
    """Where the JSON description of an exported library lives."""
    return Path(str(lib) + ".json")


def _stored_plan(logs, hw: HardwareTarget, model: ImportedModel) -> FusionPlan | None:
    if logs is None:
        return None
    tdir = target_dir(logs, hw.name)
    if not (tdir / "manifest.json").exists():
        return None
    entry = read_manifest(tdir)["models"].get(model.model_hash)
    return FusionPlan.from_json(entry["plan"]) if entry else None


def _lowering_passes(target: tvm.target.Target) -> list:
    """Relax's default pipeline after legalization and fusion, which we do ourselves."""
    import importlib

    kind = "cpu_generic" if target.kind.name == "llvm" else target.kind.name
    backend = importlib.import_module(f"tvm.relax.backend.{kind}.pipeline")
    return backend.dataflow_lower_passes(target) + backend.finalize_passes(target)


def _prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)}


def compile_model(model: ImportedModel, target: str | HardwareTarget = "host", *,
                  logs: str | Path | None = None, plan: FusionPlan | None = None,
                  planner: str = "cost") -> CompiledModel:
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
    planner : str
        Planner of a fresh plan when neither ``plan`` nor a stored plan is there.

    Returns
    -------
    CompiledModel
    """
    hw = target if isinstance(target, HardwareTarget) else load_target(target)
    tvm_target = hw.tvm_target()
    graph = build_graph(model.mod)
    plan = plan or _stored_plan(logs, hw, model) or make_plan(graph, hw, planner)
    mod = apply_plan(graph, plan)
    db = open_database(target_dir(logs, hw.name), create=False) if logs else None
    with tvm_target, tvm.transform.PassContext(opt_level=3):
        if db is not None:
            with db:
                mod = relax.transform.MetaScheduleApplyDatabase()(mod)
        funcs = _prim_funcs(mod)
        untuned = tuple(sorted(n for n, f in funcs.items()
                               if not f.attrs or not f.attrs.get("tirx.is_scheduled", False)))
        lower = tvm.transform.Sequential(_lowering_passes(tvm_target))
        try:
            ex = relax.build(lower(mod), target=tvm_target, relax_pipeline=None)
        except Exception as e:
            raise LogError(f"building {model.source} for {hw.name} failed: "
                           f"{str(e).splitlines()[-1]}") from e
    info = {
        "schema": MODULE_SCHEMA, "version": MODULE_VERSION, "tvm": tvm.__version__,
        "source": model.source, "model_hash": model.model_hash, "target": hw.name,
        "tvm_target": json.loads(json.dumps(hw.tvm_config, default=dict)), "plan_hash": plan.hash,
        "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
                   for t in model.inputs],
        "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
                    for t in model.outputs],
        "kernels": sorted(funcs), "untuned": list(untuned),
    }
    return CompiledModel(executable=ex, target=hw.name, plan=plan,
                         kernels=tuple(sorted(funcs)), untuned=untuned, info=info)
