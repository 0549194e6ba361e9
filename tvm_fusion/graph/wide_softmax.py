"""Softmax over a long float32 axis, its denominator summed in float64.

TVM's ``topi.nn.softmax`` (the legalization of ``relax.nn.softmax``) sums the row's
exponentials one after another in float32, so the denominator's rounding error grows with
the row: over PP-OCRv6's 18710 CTC classes it is off by up to 1.2e-4 relative, and every
probability with it (1.07e-4 from the float64 softmax of the same float32 logits, where
ONNX Runtime's vectorized sum is off by 6.4e-6). Accumulating that one sum in float64
makes it exact to float32 rounding; the exponentials, the max and the output stay
float32, and the PrimFunc keeps topi's name and blocks (max, exp, expsum, norm).

Rows up to :data:`WIDE_AXIS` long keep TVM's legalization (and their kernels' workload
hashes, which tuning logs are keyed by): a float32 sum over them loses under 1e-5.
"""

from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.transform.legalize_ops import nn as stock

WIDE_AXIS = 4096
"""Softmax axes longer than this sum their exponentials in float64."""


def _wide(call: relax.Call) -> int | None:
    """The softmax's axis when it is a float32 row longer than WIDE_AXIS, else None."""
    ty = call.args[0].ty
    if not isinstance(ty, relax.TensorType) or ty.dtype != "float32" or ty.shape is None:
        return None
    shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]
    axis = int(call.attrs.axis) % len(shape)
    return axis if shape[axis] is not None and shape[axis] > WIDE_AXIS else None


def _parts(x: te.Tensor, axis: int, log: bool):
    """max, float64 sum of exp(x - max), and the float32 exponentials (softmax only)."""
    def at(idx, k):  # full index: the reduced index with ``k`` put back at ``axis``
        return idx[:axis] + (k,) + idx[axis:]

    def row(idx):  # the reduced index of a full one
        return idx[:axis] + idx[axis + 1:]

    n = x.shape[axis]
    reduced = tuple(d for i, d in enumerate(x.shape) if i != axis)
    k1, k2 = te.reduce_axis((0, n), name="k"), te.reduce_axis((0, n), name="k")
    mx = te.compute(reduced, lambda *i: te.max(x[at(i, k1)], axis=k1), name="T_softmax_maxelem")
    if log:
        ex = None
        total = te.compute(reduced, lambda *i: te.sum(
            te.exp(x[at(i, k2)] - mx[i]).astype("float64"), axis=k2), name="T_softmax_expsum")
    else:
        ex = te.compute(x.shape, lambda *i: te.exp(x[i] - mx[row(i)]), name="T_softmax_exp")
        total = te.compute(reduced, lambda *i: te.sum(ex[at(i, k2)].astype("float64"), axis=k2),
                           name="T_softmax_expsum")
    return mx, total, ex, row


def _softmax_te(x: te.Tensor, axis: int) -> te.Tensor:
    _, total, ex, row = _parts(x, axis, log=False)
    return te.compute(x.shape, lambda *i: ex[i] / total[row(i)].astype(x.dtype),
                      name="T_softmax_norm", attrs={"axis": axis})


def _log_softmax_te(x: te.Tensor, axis: int) -> te.Tensor:
    mx, total, _, row = _parts(x, axis, log=True)
    return te.compute(x.shape, lambda *i: x[i] - mx[row(i)]
                      - te.log(total[row(i)]).astype(x.dtype), attrs={"axis": axis})


def _softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    axis = _wide(call)
    if axis is None:
        return stock._nn_softmax(bb, call)
    return bb.call_te(_softmax_te, call.args[0], axis, primfunc_name_hint="softmax")


def _log_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    axis = _wide(call)
    if axis is None:
        return stock._nn_log_softmax(bb, call)
    return bb.call_te(_log_softmax_te, call.args[0], axis, primfunc_name_hint="log_softmax")


LEGALIZE_MAP = {"relax.nn.softmax": _softmax, "relax.nn.log_softmax": _log_softmax}
"""Overrides for ``relax.transform.LegalizeOps(customize_legalize_map=...)``."""
