"""``conv2d_transpose`` whose stride equals its kernel: one output pixel per input pixel and tap.

TVM legalizes every transposed convolution as a convolution over the input dilated with
zeros and padded (``topi.nn.conv2d_transpose_nchw``): two materialized intermediates of
the output's size times the input channels, and for stride ``s`` a fraction ``1 - 1/s**2``
of the multiply-adds on zeros. PP-OCR det's upsampling head is two such layers with a 2x2
kernel and stride 2; untuned, the last one took 9.9 ms of the model's 40 ms, against 0.19
ms in ONNX Runtime (benchmarks/kernel_table.py). When the stride equals the kernel size
(no padding, no output padding, no dilation, one group) the taps never overlap:

    out[b, o, h, w] = sum_c data[b, c, h // s, w // s] * weight[c, o, h % s, w % s]

a reduction over the input channels alone, with no zeros and no intermediates. Every
other transposed convolution keeps TVM's legalization.
"""

from __future__ import annotations

from tvm import relax, te
from tvm.relax.transform.legalize_ops import nn as stock


def _taps_apart(attrs, weight_shape) -> bool:
    ints = lambda xs: [int(x) for x in xs]  # noqa: E731
    return (str(attrs.data_layout) == "NCHW" and str(attrs.kernel_layout) == "IOHW"
            and str(attrs.out_layout) == "NCHW" and int(attrs.groups) == 1
            and ints(attrs.dilation) == [1, 1] and not any(ints(attrs.padding))
            and not any(ints(attrs.output_padding))
            and ints(attrs.strides) == ints(weight_shape[2:]))


def _static_shape(expr) -> list[int] | None:
    ty = expr.ty
    dims = getattr(getattr(ty, "shape", None), "values", None)
    try:
        return [int(d) for d in dims] if dims is not None else None
    except TypeError:  # a symbolic dimension
        return None


def _compute(data, weight, out_dtype: str):
    n, _, h, w = data.shape
    cin, cout, sh, sw = weight.shape
    c = te.reduce_axis((0, cin), name="c")
    return te.compute(
        (n, cout, h * sh, w * sw),
        lambda b, o, y, x: te.sum(
            data[b, c, y // sh, x // sw].astype(out_dtype)
            * weight[c, o, y % sh, x % sw].astype(out_dtype), axis=c),
        name="conv2d_transpose", tag="conv2d_transpose_nchw")


def _conv2d_transpose(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    shape = _static_shape(call.args[1])
    if shape is None or not _taps_apart(call.attrs, shape):
        return stock._nn_conv2d_transpose(bb, call)  # pylint: disable=protected-access
    return bb.call_te(_compute, call.args[0], call.args[1], str(call.ty.dtype),
                      primfunc_name_hint="conv2d_transpose")


LEGALIZE_MAP = {"relax.nn.conv2d_transpose": _conv2d_transpose}
"""Overrides for ``relax.transform.LegalizeOps(customize_legalize_map=...)``."""
