"""A one-pass rewriter over the dataflow block of ``main``, the base of every rewrite here.

Each rewrite walks the bindings in order and either re-emits a binding with its arguments
substituted or emits something else in its place; what it leaves unused is removed by
dead code elimination afterwards. Rewrites see the *new* producer of a value through
:meth:`BlockRewriter.producer` and how often the *old* value is used through ``uses``.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

# Returned by :meth:`BlockRewriter.rewrite` when the rewrite recorded the value itself
# (as a deferred view) and nothing is to be emitted for the binding.
DEFER = object()


def single_block(func: relax.Function) -> relax.DataflowBlock | None:
    """The one dataflow block of ``func``, or None when it has control flow or several."""
    body = func.body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return None
    block = body.blocks[0]
    return block if isinstance(block, relax.DataflowBlock) else None


def op_name(expr) -> str:
    """``relax.add`` etc. for an operator call, "" for anything else."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return ""


def count_ops(mod: tvm.IRModule, name: str | None = None) -> int:
    """Operator calls in ``main``'s bindings (of one operator when ``name`` is given)."""
    n = 0
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            op = op_name(b.value) or ("call_tir" if isinstance(b.value, relax.Call) else "")
            if op and (name is None or op == name):
                n += 1
    return n


def const_value(expr) -> np.ndarray | None:
    """The array of a tensor constant or of a typed scalar (``T.float32(1e-5)``), else None."""
    if not isinstance(expr, tvm.ir.Constant):
        return None
    if isinstance(expr.value, tvm.runtime.Tensor):
        return expr.value.numpy()
    dtype = getattr(getattr(expr, "ty", None), "dtype", None)
    if isinstance(expr.value, (bool, int, float)) and dtype:
        return np.array(expr.value, dtype=str(dtype))
    return None


def shape_of(expr) -> tuple[int, ...] | None:
    """Static shape of a tensor expression, None when unknown or not a tensor."""
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    dims = []
    for d in shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        dims.append(int(d))
    return tuple(dims)


def dtype_of(expr) -> str:
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))


def moves_unit_axes_only(shape, perm) -> bool:
    """Whether ``permute_dims(x, perm)`` of an ``x`` of ``shape`` keeps every axis longer
    than 1 in its order: it then moves no element, and is a reshape."""
    big = [a for a in perm if shape[a] != 1]
    return big == sorted(big)


def permuted(x, perm, shape):
    """``permute_dims(x, perm)`` (``x`` of static ``shape``), as a reshape where that is
    all it is (:func:`moves_unit_axes_only`): a transpose kernel otherwise."""
    perm = [int(a) for a in perm]
    if moves_unit_axes_only(shape, perm):
        return relax.op.reshape(x, [shape[a] for a in perm])
    return relax.op.permute_dims(x, perm)


class BlockRewriter:
    """Rebuild ``main`` binding by binding; subclasses override :meth:`rewrite`.

    ``env`` maps each old var to its new value; ``uses`` counts how often an old var is
    read (by bindings and by the function's result).
    """

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self.env: dict = {}
        self.bound: dict = {}  # new var -> the expression it was emitted with
        self.uses: dict = {}
        self.bb: relax.BlockBuilder | None = None

    # -- overridables -------------------------------------------------------------------
    def rewrite(self, var: relax.Var, value) -> relax.Expr | None:
        """A replacement for ``var = value`` in new-graph terms, or None to copy it."""
        return None

    def arg(self, expr):
        """The new value of an old expression (a subclass may materialize here)."""
        return self.subst(expr)

    def bindings(self, block: relax.DataflowBlock) -> list:
        """The bindings to rebuild, in emission order (a subclass may reorder them, or
        add ``VarBinding`` objects for vars of its own that later bindings read)."""
        return list(block.bindings)

    # -- machinery ----------------------------------------------------------------------
    def run(self) -> tvm.IRModule:
        main = self.mod["main"]
        block = single_block(main)
        if block is None:
            return self.mod
        self._count_uses(block, main.body.body)
        bb = self.bb = relax.BlockBuilder()
        attrs = dict(main.attrs) if main.attrs else None
        with bb.function("main", list(main.params), attrs=attrs):
            with bb.dataflow():
                for b in self.bindings(block):
                    if isinstance(b, relax.MatchCast):  # keeps its symbolic shape vars
                        self.env[b.var] = bb.match_cast(self.copy(b.value), b.ty, b.var.name)
                        continue
                    new = self.rewrite(b.var, b.value)
                    if new is DEFER:
                        continue
                    if new is None:
                        new = self.copy(b.value)
                    self.env[b.var] = self._emit(b.var, new)
                # Every binding above is a dataflow var; the result is the one output.
                ret = bb.emit_output(self.arg(main.body.body))
            bb.emit_func_output(ret)
        new_main = bb.get()["main"]
        out = self.mod.functions.items()
        mod = tvm.IRModule({gv: f for gv, f in out if gv.name_hint != "main"},
                           attrs=self.mod.attrs)
        mod["main"] = new_main
        return mod

    def copy(self, value):
        """``value`` with every old var replaced by its new value."""
        if isinstance(value, relax.Call):
            return relax.Call(value.op, [self.arg(a) for a in value.args], value.attrs,
                              value.ty_args)
        return self.subst(value)

    def subst(self, expr):
        if isinstance(expr, relax.Var):
            return self.env.get(expr, expr)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.arg(f) for f in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return relax.TupleGetItem(self.arg(expr.tuple_value), expr.index)
        if isinstance(expr, relax.Call):
            return self.copy(expr)
        return expr

    def emit(self, expr, name: str = "lv"):
        """Emit ``expr`` (a new-graph expression) and remember its producer."""
        if isinstance(expr, (relax.Var, tvm.ir.Constant)):
            return expr
        var = self.bb.emit(expr, name_hint=name)
        self.bound[var] = expr
        return var

    def producer(self, new_expr):
        """The expression a new var was emitted with (the var itself when not ours)."""
        return self.bound.get(new_expr, new_expr)

    def _emit(self, old_var, new):
        return self.emit(new, old_var.name)

    def _count_uses(self, block, result) -> None:
        def visit(e):
            if isinstance(e, relax.Var):
                self.uses[e] = self.uses.get(e, 0) + 1

        for b in block.bindings:
            relax.analysis.post_order_visit(b.value, visit)
        relax.analysis.post_order_visit(result, visit)

