"""Deploy stage: build from logs, export, load and run."""

from .build import CompiledModel, compile_model
from .module import Module, TensorSpec, load_module

__all__ = ["CompiledModel", "Module", "TensorSpec", "compile_model", "load_module"]
