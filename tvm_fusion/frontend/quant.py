"""Converters for the integer ONNX ops TVM 0.27's Relax importer lacks or folds away.

- ``Cast`` of an int8 (or other narrow-integer) weight: the stock converter evaluates a
  Cast of a constant at conversion time, so ``int8 weight -> Cast -> Mul(scale)`` became
  a float32 weight of four times the bytes. Here it stays ``astype`` of the int8
  constant: the dequantize is an operator the planner fuses into the GEMM's prologue.
- ``ConvInteger``: ``(x - x_zp) conv (w - w_zp)`` accumulated in int32 (ONNX opset 10).
- ``QLinearConv`` / ``QLinearMatMul``: the integer product in int32 plus the int32 bias,
  requantized as ONNX says (``saturate(round_half_even(acc * x_s * w_s / y_s) + y_zp)``,
  which is ``relax.quantize`` of the float-scaled accumulator).

The stock converters for QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and
MatMulInteger are used as they are: they round half to even and saturate
(tests/test_int8.py checks them against ONNX Runtime on ``.5`` boundaries).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from .fold import INT_WEIGHT_ELEMENTS


def _is_int_weight(expr) -> bool:
    if not isinstance(expr, tvm.ir.GenericConst) or not isinstance(expr.value, tvm.runtime.Tensor):
        return False
    dtype = np.dtype(str(expr.value.dtype)) if str(expr.value.dtype) in (
        "int8", "uint8", "int16", "uint16") else None
    return dtype is not None and int(np.prod(expr.value.shape)) > INT_WEIGHT_ELEMENTS


def _cast(bb, inputs, attrs, opset):
    if not _is_int_weight(inputs[0]):
        return None  # the stock converter
    return relax.op.astype(inputs[0], onnx_frontend.get_type(attrs["to"]))


def _int32(x, zp):
    """``x - zp`` widened to int32 (zp may be absent)."""
    x = relax.op.astype(x, "int32")
    return x if zp is None else relax.op.subtract(x, relax.op.astype(zp, "int32"))


def _per_channel(bb, v, ndim: int, axis: int):
    """A scalar or per-channel 1-D qparam reshaped to broadcast along ``axis``."""
    v = bb.normalize(v)
    if len(v.ty.shape) == 0 or int(np.prod([int(d) for d in v.ty.shape])) == 1:
        return relax.op.reshape(v, ()) if len(v.ty.shape) else v
    shape = [1] * ndim
    shape[axis] = -1
    return relax.op.reshape(v, shape)


def _conv_int(bb, x, w, attrs):
    """The stock Conv converter on int32 operands: an int32 convolution (it keeps the
    input dtype, so the accumulation is int32)."""
    return onnx_frontend.Conv.get_converter(11)(bb, [x, w, None], dict(attrs), None)


def _conv_integer(bb, inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    xi = bb.normalize(_int32(x, x_zp))
    wz = None if w_zp is None else _per_channel(bb, relax.op.astype(w_zp, "int32"),
                                                len(w.ty.shape), 0)
    wi = relax.op.astype(w, "int32")
    wi = bb.normalize(wi if wz is None else relax.op.subtract(wi, wz))
    return _conv_int(bb, xi, wi, attrs)


def _requantize(bb, acc, multiplier, y_zp, ndim: int, axis: int):
    """``saturate(round_half_even(acc * multiplier) + y_zp)``: ONNX Runtime's requantize
    (one float multiplier ``x_s * w_s / y_s`` per output channel)."""
    mult = bb.normalize(_per_channel(bb, multiplier, ndim, axis))
    acc_f = bb.normalize(relax.op.multiply(relax.op.astype(acc, "float32"), mult))
    # quantize by a unit scale: relax.quantize rounds half to even and saturates.
    return relax.op.quantize(acc_f, relax.const(1.0, "float32"), y_zp, axis=axis,
                             out_dtype=str(y_zp.ty.dtype))


def _qlinear_conv(bb, inputs, attrs, opset):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    xi = bb.normalize(_int32(x, x_zp))
    wi = bb.normalize(relax.op.subtract(
        relax.op.astype(w, "int32"),
        _per_channel(bb, relax.op.astype(w_zp, "int32"), len(w.ty.shape), 0)))
    acc = bb.normalize(_conv_int(bb, xi, wi, attrs))
    ndim = len(acc.ty.shape)
    if bias is not None:
        acc = relax.op.add(acc, _per_channel(bb, bias, ndim, 1))
    mult = relax.op.divide(relax.op.multiply(x_s, w_s), y_s)
    return _requantize(bb, bb.normalize(acc), mult, y_zp, ndim, 1)


def _qlinear_matmul(bb, inputs, attrs, opset):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs[:8]
    ai = _int32(a, a_zp)
    b_zp32 = bb.normalize(relax.op.astype(b_zp, "int32"))
    bi = relax.op.subtract(relax.op.astype(b, "int32"),
                           b_zp32 if len(b_zp32.ty.shape) == 0 else
                           relax.op.reshape(b_zp32, [1, -1]))
    acc = bb.normalize(relax.op.matmul(ai, bi, out_dtype="int32"))
    ndim = len(acc.ty.shape)
    mult = relax.op.divide(relax.op.multiply(a_s, b_s), y_s)
    # A per-column B scale runs along the last axis.
    return _requantize(bb, acc, mult, y_zp, ndim, ndim - 1)


CONVERTERS = {"Cast": _cast, "ConvInteger": _conv_integer, "QLinearConv": _qlinear_conv,
              "QLinearMatMul": _qlinear_matmul}
"""op type -> ``f(bb, inputs, attrs, opset)``; None from ``f`` means the stock converter."""
