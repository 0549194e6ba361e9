"""tvm-fusion: fusion-aware auto-scheduling for Apache TVM.

The pipeline, one function per stage, each usable alone::

    model = import_model("model.onnx", shapes={"x": (1, 3, 224, 224)})  # simplified
    print(model.simplified.summary())   # what graph simplification removed
    graph = build_graph(model.mod)
    plan = plan_fusion(graph, "host")
    fused = apply_plan(graph, plan)
    report = tune(model, "host", trials=64, logs="tuning_logs",
                  plan_options=PlanOptions(layout="nchwc"),   # how a fresh plan is made
                  search_options=SearchOptions(seed=1))       # how the search runs
    compile_model(model, "host", logs="tuning_logs").export("model.so")
    outputs = load_module("model.so")(x)
    outputs = jit("model.onnx", target="host", logs="tuning_logs")(x)  # cached per shape

Importing the package (or any of its subpackages) changes nothing process-wide: no
environment variable, no TVM lowering rule, no ``inspect`` function
(tests/test_import_state.py). What tvm-fusion needs it applies where it needs it:

- TVM's thread pool on every core (``TVM_NUM_THREADS``, ``TVM_BIND_THREADS``):
  :func:`tvm_fusion.config.use_all_cores`, called by ``tune``, ``compile_model``,
  ``jit``, ``load_module`` and the command line before they build or run a kernel; it
  keeps what the user set and stays set for the process.
- float32 ``exp`` as a vectorizable polynomial: installed for the length of each build
  (:func:`tvm_fusion.compat.fast_math.vectorizable_exp`), TVM's own rule otherwise.
- TVMScript's stack inspection made light while TVM's tensor intrinsics are parsed
  (:func:`tvm_fusion.compat.fast_import.light_parser_stack`), for that import only.
"""

from __future__ import annotations

from .deploy import CompiledModel, Module, compile_model, jit, load_module
from .errors import TvmFusionError
from .frontend import ImportedModel, TensorInfo, parse_shape
from .graph import OpGraph, build_graph
from .plan import FusedGroup, FusionPlan, PlanOptions, apply_plan, plan_fusion
from .simplify import SimplifyReport, import_model, simplify_model
from .targets import HardwareTarget, list_targets, load_target
from .tune import RpcOptions, SearchOptions, TuneReport, tune
from .version import __version__


__all__ = [
    "CompiledModel", "FusedGroup", "FusionPlan", "HardwareTarget", "ImportedModel",
    "Module", "OpGraph", "PlanOptions", "RpcOptions", "SearchOptions", "SimplifyReport",
    "TensorInfo", "TuneReport", "TvmFusionError",
    "apply_plan", "build_graph", "compile_model", "import_model", "jit", "list_targets",
    "load_module", "load_target", "parse_shape", "plan_fusion", "simplify_model", "tune",
]
