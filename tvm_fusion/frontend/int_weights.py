"""Keep narrow-integer weights integer through Relax constant folding.

TVM's ``FoldConstant`` evaluates every call whose arguments are all constants, so
``dequantize(int8 weight, scale, zp)`` or ``astype(int8 weight, "float32") * scale``
becomes a float32 weight of four times the bytes, and the model silently stops being
int8. :func:`fold_keeping_int_weights` runs a folding pass with those weights lifted out
of reach (as parameters of ``main``) and binds them back afterwards, so the dequantize
stays an operator: the planner fuses it into the GEMM that reads it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

# Same threshold as the ONNX-level fold (frontend/fold.py INT_WEIGHT_ELEMENTS).
from .fold import INT_WEIGHT_ELEMENTS

_NARROW_INTS = frozenset({"int8", "uint8", "int4", "uint4", "int16", "uint16"})
_PREFIX = "tvmf_int_weight_"


def is_int_weight(const: tvm.ir.Constant) -> bool:
    """Whether a Relax constant is a narrow-integer tensor big enough to be a weight."""
    value = const.value
    if not isinstance(value, tvm.runtime.Tensor):
        return False  # a typed scalar
    return str(value.dtype) in _NARROW_INTS and int(np.prod(value.shape)) > INT_WEIGHT_ELEMENTS


@relax.expr_functor.mutator
class _Lifter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.lifted: list[tuple[relax.Var, tvm.ir.Constant]] = []
        self._seen: dict = {}

    def visit_generic_const_(self, op):  # noqa: D102 - ExprMutator hook
        if not is_int_weight(op):
            return op
        key = op  # an Object hashes by identity (id() of a Python wrapper is reused)
        if key not in self._seen:
            var = relax.Var(f"{_PREFIX}{len(self.lifted)}", op.ty)
            self._seen[key] = var
            self.lifted.append((var, op))
        return self._seen[key]


def fold_keeping_int_weights(mod: tvm.IRModule,
                             fold: Callable[[tvm.IRModule], tvm.IRModule]) -> tvm.IRModule:
    """``fold(mod)`` with every narrow-integer weight of ``main`` kept a constant of its
    own dtype (not folded into the float value a dequantize of it computes).

    Parameters
    ----------
    mod : tvm.IRModule
        A module whose ``main`` may embed int8/uint8 (or int4/int16) weights.
    fold : callable
        A pass or pass sequence that folds constants (``FoldConstant`` among others).

    Returns
    -------
    tvm.IRModule
        The folded module; ``main`` keeps its signature.
    """
    func = mod["main"]
    lifter = _Lifter(mod)
    body = lifter.visit_expr(func.body)
    if not lifter.lifted:
        return fold(mod)
    lifted = relax.Function([*func.params, *(v for v, _ in lifter.lifted)], body,
                            func.ret_ty, func.is_pure, func.attrs, func.span)
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    mod.update_func(mod.get_global_var("main"), lifted)
    mod = fold(mod)
    # BindParams turns the lifted parameters back into the very same constants.
    return relax.transform.BindParams("main", {v.name: c.value for v, c in lifter.lifted})(mod)
