"""Frontend stage: ONNX model -> static-shape Relax IRModule."""

from __future__ import annotations

from .onnx_import import ImportedModel, import_model
from .shapes import TensorInfo, parse_shape

__all__ = ["ImportedModel", "TensorInfo", "import_model", "parse_shape"]
