"""Quantized versions of zoo models, made with ONNX Runtime's own tools (issue 21).

Nothing here is committed as a model: each call quantizes the float zoo model into the
directory given (a test's tmp dir, a benchmark's cache), with

- ``static_qdq``: ``onnxruntime.quantization.quantize_static`` in QDQ format (uint8
  activations, per-channel int8 weights), calibrated over a few seeded random inputs,
  after ``quant_pre_process`` as ONNX Runtime's quantization docs ask (it folds batch
  norm into the convs, so no Q/DQ pair is left around a BatchNormalization);
- ``dynamic``: ``onnxruntime.quantization.quantize_dynamic`` (int8 weights;
  DynamicQuantizeLinear + MatMulInteger, as it writes transformers).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from tvm_fusion import zoo
from tvm_fusion.frontend.fold import fix_input_shapes


def _float_model(name: str, shapes: dict | None) -> tuple[onnx.ModelProto, dict]:
    if name == "resnet50":  # benchmarks/synthetic.py's, NHWC
        from benchmarks.synthetic import resnet50_path
        shapes = dict(shapes or {"x": (1, 224, 224, 3)})
        return fix_input_shapes(onnx.load(str(resnet50_path())), shapes), shapes
    spec = zoo.ZOO[name]
    shapes = dict(shapes or spec.shapes)
    return fix_input_shapes(onnx.load(str(zoo.fetch(name))), shapes), shapes


class _Reader:
    """A CalibrationDataReader over ``n`` seeded random inputs (float32 normal)."""

    def __init__(self, shapes: dict, n: int, seed: int):
        rng = np.random.default_rng(seed)
        self._batches = iter([{k: rng.standard_normal(s).astype(np.float32)
                               for k, s in shapes.items()} for _ in range(n)])

    def get_next(self):
        return next(self._batches, None)

    def rewind(self):  # part of the CalibrationDataReader protocol; one pass is enough
        pass


def static_qdq(name: str, out_dir: str | Path, *, shapes: dict | None = None,
               calibration: int = 4, seed: int = 0, preprocess: bool = True) -> Path:
    """``quantize_static`` (QDQ, uint8 activations, per-channel int8 weights) of zoo
    model ``name`` with input ``shapes`` fixed; returns the path of the ``.onnx``.

    With ``preprocess`` (default), the float model goes through ONNX Runtime's
    ``quant_pre_process`` first (shape inference and its basic graph optimizations,
    which fold BatchNormalization into the preceding Conv). ``False`` quantizes the
    model as shipped, batch norms and all.
    """
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model, shapes = _float_model(name, shapes)
    out = Path(out_dir) / f"{name}-qdq.onnx"
    src = Path(out_dir) / f"{name}-fp32.onnx"
    onnx.save(model, str(src))
    if preprocess:
        pre = Path(out_dir) / f"{name}-fp32-pre.onnx"
        # the input shapes are fixed above, so ONNX's own shape inference is enough
        # (symbolic shape inference would need sympy, for nothing)
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        src = pre
    reader = type("Reader", (_Reader, CalibrationDataReader), {})(shapes, calibration, seed)
    logging.getLogger().setLevel(logging.ERROR)  # its per-node notes are noise here
    quantize_static(str(src), str(out), reader, quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True)
    return out


def dynamic(name: str, out_dir: str | Path, *, shapes: dict | None = None) -> Path:
    """``quantize_dynamic`` (int8 weights) of zoo model ``name`` with input ``shapes``
    fixed; returns the path of the ``.onnx``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, _ = _float_model(name, shapes)
    src = Path(out_dir) / f"{name}-fp32.onnx"
    out = Path(out_dir) / f"{name}-dynamic.onnx"
    onnx.save(model, str(src))
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8)
    return out
