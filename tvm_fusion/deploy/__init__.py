"""Deploy stage: build from logs, export, load and run."""

from .build import CompiledModel, compile_model
from .jit import JitFunction, UntunedShapeWarning, jit
from .module import Module, TensorSpec, load_module

__all__ = ["CompiledModel", "JitFunction", "Module", "TensorSpec", "UntunedShapeWarning",
           "compile_model", "jit", "load_module"]
