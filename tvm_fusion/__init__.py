"""tvm-fusion: fusion-aware auto-scheduling for Apache TVM.

The pipeline, one function per stage, each usable alone::

    model = import_model("model.onnx", shapes={"x": (1, 3, 224, 224)})  # simplified
    print(model.simplified.summary())   # what graph simplification removed
    graph = build_graph(model.mod)
    plan = plan_fusion(graph, "host")
    fused = apply_plan(graph, plan)
    report = tune(model, "host", trials=64, logs="tuning_logs")
    compile_model(model, "host", logs="tuning_logs").export("model.so")
    outputs = load_module("model.so")(x)
    outputs = jit("model.onnx", target="host", logs="tuning_logs")(x)  # cached per shape
"""

from __future__ import annotations

from .config import use_all_cores

use_all_cores()  # before any TVM kernel runs: TVM's default is half the cores on x86

from .deploy import CompiledModel, Module, compile_model, jit, load_module
from .errors import TvmFusionError
from .frontend import ImportedModel, TensorInfo, parse_shape
from .graph import OpGraph, build_graph
from .plan import FusedGroup, FusionPlan, apply_plan, plan_fusion
from .simplify import SimplifyReport, import_model, simplify_model
from .targets import HardwareTarget, list_targets, load_target
from .tune import TuneReport, tune
from .version import __version__


__all__ = [
    "CompiledModel", "FusedGroup", "FusionPlan", "HardwareTarget", "ImportedModel",
    "Module", "OpGraph", "SimplifyReport", "TensorInfo", "TuneReport", "TvmFusionError",
    "apply_plan", "build_graph", "compile_model", "import_model", "jit", "list_targets",
    "load_module", "load_target", "parse_shape", "plan_fusion", "simplify_model", "tune",
]
