"""tvm-fusion: fusion-aware auto-scheduling for Apache TVM.

The pipeline, one function per stage, each usable alone::

    model = import_model("model.onnx", shapes={"x": (1, 3, 224, 224)})
    graph = build_graph(model.mod)
    plan = plan_fusion(graph, "host")
    fused = apply_plan(graph, plan)
    report = tune(model, "host", trials=64, logs="tuning_logs")
    compile_model(model, "host", logs="tuning_logs").export("model.so")
    outputs = load_module("model.so")(x)
    outputs = jit("model.onnx", target="host", logs="tuning_logs")(x)  # cached per shape
"""

from __future__ import annotations

__version__ = "0.1.0"

from .deploy import CompiledModel, Module, compile_model, jit, load_module
from .errors import TvmFusionError
from .frontend import ImportedModel, TensorInfo, import_model, parse_shape
from .graph import OpGraph, build_graph
from .plan import FusedGroup, FusionPlan, apply_plan
from .targets import HardwareTarget, list_targets, load_target
from .tune import TuneReport, tune


def plan_fusion(graph: OpGraph, target: str | HardwareTarget = "host", *,
                planner: str = "cost") -> FusionPlan:
    """Partition ``graph``'s operators into kernels for ``target``.

    Parameters
    ----------
    graph : OpGraph
        From :func:`build_graph`.
    target : str or HardwareTarget
        A name from ``hw_targets/`` or ``"host"``.
    planner : str
        ``"cost"`` (default): the hardware-aware planner, by predicted time on
        ``target``. ``"fuseops"``: TVM's own FuseOps partition, the baseline.

    Returns
    -------
    FusionPlan
        Groups of operators, each with its stable op names, predicted time and the
        reason for it (``plan.explain(op)`` answers why an op was or was not fused).
    """
    from .plan import make_plan

    hw = target if isinstance(target, HardwareTarget) else load_target(target)
    return make_plan(graph, hw, planner)


__all__ = [
    "CompiledModel", "FusedGroup", "FusionPlan", "HardwareTarget", "ImportedModel",
    "Module", "OpGraph", "TensorInfo", "TuneReport", "TvmFusionError", "apply_plan",
    "build_graph", "compile_model", "import_model", "jit", "list_targets", "load_module",
    "load_target", "parse_shape", "plan_fusion", "tune",
]
