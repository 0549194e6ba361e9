"""Constant folding in numpy for the ops the rewrites leave on constants.

TVM's FoldConstant legalizes and compiles a kernel for every constant expression (about
30 ms of LLVM each: 30 s for a batch-norm-heavy CNN); the expressions here (batch norm
statistics, reshaped biases, permuted constants) are simple elementwise arithmetic, so
numpy folds them at once. Anything else is left to FoldConstant.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_fusion.frontend.int_weights import fold_keeping_int_weights, is_int_weight

from .block import BlockRewriter, const_value, op_name, shape_of

_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract,
           "relax.multiply": np.multiply, "relax.divide": np.divide,
           "relax.maximum": np.maximum, "relax.minimum": np.minimum}
_UNARY = {"relax.sqrt": np.sqrt, "relax.rsqrt": lambda a: 1 / np.sqrt(a),
          "relax.negative": np.negative, "relax.exp": np.exp, "relax.abs": np.abs}
_SHAPE = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.broadcast_to"}
# exact in numpy for any dtype; unrolled loops compare constant counters (captcha-crnn's
# 40 ``less`` made FoldConstant compile 200 kernels: a minute of its import)
_COMPARE = {"relax.less": np.less, "relax.less_equal": np.less_equal,
            "relax.greater": np.greater, "relax.greater_equal": np.greater_equal,
            "relax.equal": np.equal, "relax.not_equal": np.not_equal,
            "relax.logical_and": np.logical_and, "relax.logical_or": np.logical_or}


def _fold(value) -> np.ndarray | None:
    op = op_name(value)
    args = [const_value(a) for a in value.args]
    if op in _BINARY and args[0] is not None and args[1] is not None:
        if args[0].dtype != args[1].dtype or not np.issubdtype(args[0].dtype, np.floating):
            return None
        with np.errstate(all="ignore"):
            return _BINARY[op](args[0], args[1]).astype(args[0].dtype)
    if op in _COMPARE and args[0] is not None and args[1] is not None:
        if args[0].dtype != args[1].dtype:
            return None
        return _COMPARE[op](args[0], args[1])
    if op == "relax.logical_not" and args[0] is not None and args[0].dtype == np.bool_:
        return np.logical_not(args[0])
    if op in _UNARY and args[0] is not None and np.issubdtype(args[0].dtype, np.floating):
        with np.errstate(all="ignore"):
            return _UNARY[op](args[0]).astype(args[0].dtype)
    if op in ("relax.isnan", "relax.isinf") and args[0] is not None:
        return (np.isnan if op == "relax.isnan" else np.isinf)(args[0])
    if op == "relax.where" and all(a is not None for a in args):
        if args[1].dtype != args[2].dtype or args[0].dtype != np.bool_:
            return None
        return np.where(*args)
    if op == "relax.permute_dims" and args[0] is not None:
        axes = value.attrs.axes
        return np.transpose(args[0], None if axes is None else [int(a) for a in axes])
    if op == "relax.dequantize" and all(a is not None for a in args):
        return _dequantize(value, *args)
    if op == "relax.astype" and args[0] is not None:
        to = str(value.attrs.dtype)
        if to in ("float16", "float32", "float64") and args[0].dtype.kind == "f":
            return args[0].astype(to)
    return None


def _dequantize(call, data, scale, zp) -> np.ndarray | None:
    """``(data - zp) * scale`` as TVM's legalization computes it (int32 difference, then
    float32), for a constant that is not an integer weight (those stay integer)."""
    if str(call.attrs.out_dtype) != "float32" or data.dtype.kind not in "iu" \
            or is_int_weight(call.args[0]):
        return None
    axis = int(call.attrs.axis) % max(data.ndim, 1)

    def along(q):  # a per-axis 1-D qparam broadcast along ``axis``
        q = np.asarray(q)
        if q.size == 1:
            return q.reshape(())
        return q.reshape([-1 if d == axis else 1 for d in range(data.ndim)])

    diff = data.astype(np.int32) - along(zp).astype(np.int32)
    return diff.astype(np.float32) * along(scale).astype(np.float32)


class NumpyFolder(BlockRewriter):
    """Fold constant-only elementwise, reshape and transpose calls; count them."""

    def __init__(self, mod):
        super().__init__(mod)
        self.folded = 0

    def rewrite(self, var, value):
        if not isinstance(value, relax.Call):
            return None
        new = self.copy(value)
        op = op_name(new)
        if op in _SHAPE and const_value(new.args[0]) is not None:
            shape = shape_of(var)
            out = None if shape is None else np.broadcast_to(
                const_value(new.args[0]), shape) if op == "relax.broadcast_to" else \
                const_value(new.args[0]).reshape(shape)
        else:
            out = _fold(new)
        if out is None:
            return new
        self.folded += 1
        return relax.const(np.array(out, order="C"), str(out.dtype))


def constant_calls(mod: tvm.IRModule) -> int:
    """Operator calls in ``main`` whose arguments are all constants."""
    n = 0
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if op_name(v) and v.args and all(
                    isinstance(a, (tvm.ir.Constant, relax.ShapeExpr)) for a in v.args):
                n += 1
    return n


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold in numpy what it can, then with FoldConstant only if something is left."""
    mod = NumpyFolder(mod).run()
    if constant_calls(mod):
        mod = fold_keeping_int_weights(mod, relax.transform.FoldConstant())
    return mod
