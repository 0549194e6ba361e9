"""Affine folding: per-channel constant Mul/Div/Add/Sub around a Conv or MatMul.

Relay's FoldScaleAxis, for Relax. Forward: ``gemm(x, W) [+ b]`` followed by ``* s``,
``/ s``, ``+ t`` or ``- t`` with a constant broadcast along the output channel becomes
``gemm(x, W * s) + (b * s + t)``: the chain's ops vanish into the weights and one bias.
Backward: ``gemm(x * s, W)`` with ``s`` along the input channel becomes
``gemm(x, W * s)`` (exact with zero padding: the padded zeros stay zero). The folded
results differ from the original only by float rounding (products are reassociated).

A value is folded only when the op is its single reader, so no work is duplicated.
"""

from __future__ import annotations

import re

import numpy as np
from tvm import relax

from .block import BlockRewriter, const_value, op_name, shape_of, single_block

FOLDED_BN = "bn_folded"
"""Name of the bias add a batch norm (or a per-channel scale and shift, which is what a
batch norm is at inference) folded into: the planner's pattern library reads it as
``BN`` (``Conv-BN-ReLU``), not as a plain ``Bias``."""

_CONVS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
                    "relax.nn.conv2d_transpose"})
_FORWARD = frozenset({"relax.multiply", "relax.divide", "relax.add", "relax.subtract"})


class _Gemm:
    """A conv or a matmul with a constant weight: how to re-emit it with new weights."""

    def __init__(self, call):
        self.call = call
        self.weight = const_value(call.args[1])
        op = op_name(call)
        if op == "relax.matmul":
            self.out_axis, self.w_out, self.in_axis, self.w_in = -1, 1, -1, 0
            return
        a = call.attrs
        out_layout = str(a.out_layout or a.data_layout)
        self.out_axis = out_layout.index("C")
        self.in_axis = str(a.data_layout).index("C")
        self.w_out = str(a.kernel_layout).index("O")
        self.w_in = str(a.kernel_layout).index("I")

    @staticmethod
    def of(expr) -> _Gemm | None:
        op = op_name(expr)
        if op not in _CONVS and op != "relax.matmul":
            return None
        w = const_value(expr.args[1])
        if w is None or not np.issubdtype(w.dtype, np.floating):
            return None
        if op == "relax.matmul" and w.ndim != 2:
            return None
        if op == "relax.nn.conv2d_transpose" and int(expr.attrs.groups) != 1:
            return None
        return _Gemm(expr)

    def with_weight(self, w: np.ndarray):
        args = [self.call.args[0], relax.const(w.astype(self.weight.dtype))]
        return relax.Call(self.call.op, args, self.call.attrs, self.call.ty_args)

    def scaled_out(self, s: np.ndarray) -> np.ndarray:
        shape = [1] * self.weight.ndim
        shape[self.w_out] = -1
        return self.weight * s.reshape(shape)

    def scaled_in(self, s: np.ndarray) -> np.ndarray | None:
        w = self.weight
        groups = 1 if op_name(self.call) == "relax.matmul" else int(self.call.attrs.groups)
        shape = [1] * w.ndim
        if groups == 1 and w.shape[self.w_in] == s.size:
            shape[self.w_in] = -1
            return w * s.reshape(shape)
        if w.shape[self.w_in] == 1 and groups == s.size:  # depthwise: out o reads in o // m
            per = w.shape[self.w_out] // groups
            shape[self.w_out] = -1
            return w * np.repeat(s, per).reshape(shape)
        return None


def channel_vector(c: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """``c`` as one value per channel of a tensor of ``shape``, or None if it is not that."""
    n = len(shape)
    if c.ndim > n:
        return None
    full = c.reshape((1,) * (n - c.ndim) + c.shape)
    axis %= n
    if any(d != 1 for i, d in enumerate(full.shape) if i != axis):
        return None
    if full.shape[axis] not in (1, shape[axis]):
        return None
    return np.broadcast_to(full.reshape(-1), (shape[axis],)).astype(c.dtype)


class AffineFolder(BlockRewriter):
    """See the module docstring. Counts folded ops and the gemms that took them."""

    def __init__(self, mod):
        super().__init__(mod)
        # new var -> (gemm var, _Gemm, bias vector or None, chain id)
        self.forms: dict = {}
        self.ops = 0
        self.chains: set = set()  # ids of the original gemms that took folded ops
        self.scaled: set = set()  # chains that took a per-channel scale: a batch norm

    def rewrite(self, var, value):
        op = op_name(value)
        gemm = _Gemm.of(self.copy(value)) if (op in _CONVS or op == "relax.matmul") else None
        if gemm is not None:
            return self._backward(var, value, gemm)
        if op not in _FORWARD:
            return None
        a, b = value.args
        x, c = (a, const_value(self.subst(b)))
        if c is None and op in ("relax.add", "relax.multiply"):
            x, c = b, const_value(self.subst(a))
        if c is None or self.uses.get(x, 0) != 1:
            return None
        form = self.forms.get(self.subst(x))
        if form is None:
            return None
        gvar, g, bias, chain = form
        if re.fullmatch(rf"{FOLDED_BN}\d*", x.name):  # a batch norm folded before
            self.scaled.add(chain)
        shape = shape_of(self.subst(x))
        s = channel_vector(c, shape, g.out_axis)
        if s is None or s.dtype != g.weight.dtype or (op == "relax.divide" and not s.all()):
            return None
        if op in ("relax.multiply", "relax.divide"):
            w = g.scaled_out(s) if op == "relax.multiply" else g.scaled_out(1 / s)
            gvar = self.emit(g.with_weight(w), "folded")
            g = _Gemm(self.producer(gvar))
            if bias is not None:
                bias = bias * s if op == "relax.multiply" else bias / s
            self._count(chain)
            if s.size > 1 and not np.all(s == s[0]):
                self.scaled.add(chain)
        else:
            step = s if op == "relax.add" else -s
            if bias is not None:  # a bias add already there: this one vanishes into it
                self._count(chain)
            bias = step if bias is None else bias + step
        return self._emit_form(var, gvar, g, bias, shape, chain)

    def _count(self, chain) -> None:
        self.ops += 1
        self.chains.add(chain)

    def _emit_form(self, var, gvar, g, bias, shape, chain):
        if bias is None:
            self.forms[gvar] = (gvar, g, None, chain)
            return gvar
        bshape = [1] * len(shape)
        bshape[g.out_axis] = -1
        const = relax.const(bias.reshape(bshape).astype(g.weight.dtype))
        out = self.emit(relax.op.add(gvar, const),
                        FOLDED_BN if chain in self.scaled else var.name)
        self.forms[out] = (gvar, g, bias, chain)
        return out

    def _backward(self, var, value, gemm):
        # gemm(x * s, W) -> gemm(x, W * s) when the scaled x is read by this gemm alone.
        src = value.args[0]
        new_src = self.subst(src)
        scaled = self.producer(new_src)
        if op_name(scaled) in ("relax.multiply", "relax.divide") and \
                self.uses.get(src, 0) == 1:
            x, c = scaled.args[0], const_value(scaled.args[1])
            if c is None and op_name(scaled) == "relax.multiply":
                x, c = scaled.args[1], const_value(scaled.args[0])
            shape = shape_of(x)
            s = None if c is None or shape is None else channel_vector(c, shape, gemm.in_axis)
            w = None
            if s is not None and s.dtype == gemm.weight.dtype and shape == shape_of(new_src) \
                    and (op_name(scaled) == "relax.multiply" or s.all()):
                w = gemm.scaled_in(s if op_name(scaled) == "relax.multiply" else 1 / s)
            if w is not None:
                call = relax.Call(value.op, [x, relax.const(w)], value.attrs, value.ty_args)
                gvar = self.emit(call, var.name)
                self._count(gvar)
                self.forms[gvar] = (gvar, _Gemm(self.producer(gvar)), None, gvar)
                return gvar
        gvar = self.emit(gemm.call, var.name)
        self.forms[gvar] = (gvar, gemm, None, gvar)
        return gvar


class _Renamer(BlockRewriter):
    def __init__(self, mod, names):
        super().__init__(mod)
        self.names = names

    def _emit(self, old_var, new):
        return self.emit(new, self.names.get(old_var, old_var.name))


def name_folded_batch_norms(before, after):
    """``after`` (``before`` through TVM's FoldBatchnormToConv2D) with the bias adds the
    batch norms became named :data:`FOLDED_BN`: the pass names each after the batch
    norm's result it replaces."""
    results = set()
    for block in before["main"].body.blocks:
        bns = {b.var for b in block.bindings if op_name(b.value) == "relax.nn.batch_norm"}
        results |= {b.var.name for b in block.bindings
                    if isinstance(b.value, relax.TupleGetItem) and b.value.index == 0
                    and b.value.tuple_value in bns}
    if not results or single_block(after["main"]) is None:
        return after
    block = single_block(after["main"])
    convs = {b.var for b in block.bindings if op_name(b.value) in _CONVS}
    names = {b.var: FOLDED_BN for b in block.bindings
             if op_name(b.value) == "relax.add" and b.var.name in results
             and b.value.args[0] in convs}
    return _Renamer(after, names).run() if names else after
