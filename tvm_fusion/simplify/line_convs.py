"""1-D and tiny pointwise convolutions in NHWC: a GEMM with the channels in vector lanes.

An NCHW (or NCW) convolution is a loop over output rows with the output's last axis in
vector lanes; that is how tvm-fusion's register tile (``schedules/cpu_rules.py``) blocks it,
and it needs that axis to be a multiple of the vector. A 1-D conv written as a 2-D one
(tf2onnx's ``Conv1D``: W = 1 and a k x 1 kernel) has a last axis of 1, and a line whose
length is no multiple of 16 (Magika's 508 positions) has no vector-multiple tile either:
Magika's 256 -> 512 channel, k = 5 conv ran at 115 GFLOP/s, 46% of the FMA peak, under
MetaSchedule's SSRSRS tiling. Yet such a conv is a GEMM in disguise: positions x output
channels, reduced over input channels x taps. In NHWC its output channels are the last
axis and its positions the rows, which is the register tile's matmul; tuned alone it
reached 233 GFLOP/s (93%; benchmarks/RESULTS.md run 16).

:class:`LineConvs` rewrites such convs as ``permute_dims`` -> NHWC (NWC) conv ->
``permute_dims`` back, the weight transposed once to HWIO (WIO). The transposes then
sink and cancel with the model's own (:mod:`.transposes`): tf2onnx's ``Conv1D`` is a
transpose of NWC data into NCHW, so Magika runs its conv and the ops after it in NHWC
with no transpose left. A conv qualifies when:

- it is 1-D: one spatial axis of 1 in input and output with a kernel of 1 along it
  (``conv1d`` always), or pointwise (1 x 1 kernel) over at most :data:`LANES` output
  positions;
- its output positions along the last axis are not a multiple of :data:`LANES` (else the
  NCHW form tiles already) and there are at least 2 (one is a GEMV, bound by the weight's
  bytes in any layout);
- its output channels are a multiple of :data:`LANES`, groups 1, float, static shapes.

:data:`LANES` is AVX-512's fp32 vector (a multiple of AVX2's 8), so the rewrite is target
independent, as :mod:`tvm_fusion.graph.pad_columns` is.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .block import BlockRewriter, const_value, dtype_of, op_name, permuted, shape_of

LANES = 16
"""Output channels must be a multiple of this; the NCHW last axis must not be."""

# (data, kernel) layouts in, their channel-last forms and the permutations to them
_FORMS = {
    "relax.nn.conv2d": (("NCHW", "OIHW"), ("NHWC", "HWIO"), (0, 2, 3, 1), (2, 3, 1, 0)),
    "relax.nn.conv1d": (("NCW", "OIW"), ("NWC", "WIO"), (0, 2, 1), (2, 1, 0)),
}


def is_line_conv(call, out_shape) -> bool:
    """Whether ``call`` (a conv2d or conv1d) is one :class:`LineConvs` moves to NHWC."""
    form = _FORMS.get(op_name(call))
    if form is None:
        return False
    a = call.attrs
    (data, kernel), _, _, _ = form
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or data)) \
            != (data, kernel, data) or int(a.groups) != 1:
        return False
    xs, ws = shape_of(call.args[0]), shape_of(call.args[1])
    if xs is None or ws is None or out_shape is None \
            or not dtype_of(call.args[0]).startswith("float"):
        return False
    positions = int(np.prod(out_shape[2:]))
    if out_shape[1] % LANES or out_shape[-1] % LANES == 0 or positions < 2:
        return False
    return len(xs) == 3 or _one_dimensional(xs, ws, out_shape) or (
        ws[2:] == (1, 1) and positions <= LANES)


def _one_dimensional(xs, ws, ys) -> bool:
    """A 2-D conv along one axis: the other is 1 in input, kernel and output."""
    return any(xs[d] == ws[d] == ys[d] == 1 for d in (2, 3))


class LineConvs(BlockRewriter):
    """See the module docstring; ``convs`` counts the convolutions moved to NHWC."""

    def __init__(self, mod):
        super().__init__(mod)
        self.convs = 0

    def rewrite(self, var, value):
        op = op_name(value)
        if not is_line_conv(value, shape_of(var)):
            return None
        _, (data, kernel), to_last, to_hwio = _FORMS[op]
        xt = self.emit(self._channels_last(self.arg(value.args[0]), to_last), "nhwc")
        weight = const_value(value.args[1])
        if weight is not None:  # transposed once, here: the conv reads HWIO constants
            wt = relax.const(np.ascontiguousarray(weight.transpose(to_hwio)), str(weight.dtype))
        else:
            wt = self.emit(relax.op.permute_dims(self.arg(value.args[1]), list(to_hwio)))
        a = value.attrs
        fn = relax.op.nn.conv2d if op == "relax.nn.conv2d" else relax.op.nn.conv1d
        out_dtype = str(a.out_dtype) if a.out_dtype is not None else ""
        y = self.emit(fn(xt, wt, a.strides, a.padding, a.dilation, 1, data, kernel, data,
                         out_dtype if out_dtype not in ("", "void", "None") else None),
                      var.name)
        self.convs += 1
        back = [int(i) for i in np.argsort(to_last)]
        return permuted(y, back, shape_of(y))

    def _channels_last(self, x, perm):
        """``x`` permuted by ``perm``; when ``x`` is itself a transpose (tf2onnx's NWC ->
        NCHW before its Conv1D), one permutation of its input: often the identity or a
        reshape."""
        src = self.producer(x)
        if op_name(src) == "relax.permute_dims" and shape_of(src.args[0]) is not None:
            u = src.args[0]
            axes = src.attrs.axes
            q = [int(a) for a in axes] if axes is not None else list(range(len(perm)))[::-1]
            composed = [q[a] for a in perm]
            if composed == sorted(composed):
                return u
            return permuted(u, composed, shape_of(u))
        return permuted(x, perm, shape_of(x))
