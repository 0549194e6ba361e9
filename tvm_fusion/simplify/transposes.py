"""Transpose sinking and cancellation.

Every value is kept as a *view* ``permute_dims(u, perm)`` of an emitted value ``u``: a
transpose only composes the view's permutation, elementwise and broadcast ops run on
``u`` (constant operands are permuted to match, folded here), reductions and softmax run
on ``u`` with their axes remapped, and an NCHW conv or pool whose input is an NHWC view
runs in NHWC. A view is materialized (one transpose, shared by its readers) only where
an op needs the permuted value itself. Inverse pairs compose to the identity and vanish.
Moving data never changes it, so the result is bit-for-bit the same.

The rewrite is kept only if it does not move more bytes through transposes than before
(a transpose read by several ops can end up materialized more than once).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .block import DEFER, BlockRewriter, const_value, op_name, permuted, shape_of

_UNARY = frozenset(f"relax.{n}" for n in (
    "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "exp", "floor", "log",
    "negative", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "square",
    "tan", "tanh", "clip", "astype", "isnan", "isinf", "isfinite", "logical_not",
    "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.leakyrelu", "nn.relu6")) | {
    "relax.bitwise_not"}
_NARY = frozenset(f"relax.{n}" for n in (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum",
    "mod", "floor_mod", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "where"))
_REDUCE = frozenset(f"relax.{n}" for n in ("sum", "mean", "max", "min", "prod",
                                            "variance", "std"))
_ARG_REDUCE = frozenset({"relax.argmax", "relax.argmin"})
_SOFTMAX = frozenset({"relax.nn.softmax", "relax.nn.log_softmax"})
_NHWC_VIEW = (0, 3, 1, 2)  # an NCHW view of an NHWC tensor


def _identity(n: int) -> tuple[int, ...]:
    return tuple(range(n))


def _inverse(p) -> tuple[int, ...]:
    inv = [0] * len(p)
    for i, a in enumerate(p):
        inv[a] = i
    return tuple(inv)


def transposed_elements(mod: tvm.IRModule) -> int:
    """Elements moved by the transposes in ``main`` (what this rewrite must not raise)."""
    total = 0
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if op_name(b.value) == "relax.permute_dims":
                shape = shape_of(b.var) or ()
                total += int(np.prod(shape, dtype=np.int64))
    return total


class TransposeSinker(BlockRewriter):
    """See the module docstring. Counts cancelled pairs and convs/pools moved to NHWC.

    ``from_convs`` sinks only the transposes of channel-last conv outputs (those
    :mod:`.line_convs` puts after the convs it moves) and the ops they reach; every other
    transpose stays as it is, so that the keep-or-drop decision on the result is about
    those alone.
    """

    def __init__(self, mod, *, nhwc: bool = True, from_convs: bool = False):
        super().__init__(mod)
        self.nhwc = nhwc
        self.from_convs = from_convs
        self.views: dict = {}  # old var -> (new value u, perm)
        self._made: dict = {}  # (u, perm) -> materialized transpose
        self.pairs = 0
        self.nhwc_ops = 0

    # A view of an old expression: (new value, perm); perm is the identity for plain ones.
    def view(self, expr):
        if isinstance(expr, relax.Var) and expr in self.views:
            return self.views[expr]
        new = self.subst(expr)
        if isinstance(getattr(new, "ty", None), tvm.ir.PrimType):
            return new, ()  # a scalar: the same in any layout
        shape = shape_of(new)
        return new, _identity(len(shape)) if shape is not None else None

    def arg(self, expr):
        if isinstance(expr, relax.Var) and expr in self.views:
            u, p = self.views[expr]
            key = (u, p)
            if key not in self._made:
                shape = shape_of(u)
                move = (permuted(u, p, shape) if shape is not None
                        else relax.op.permute_dims(u, list(p)))
                self._made[key] = self.emit(move, "pt")
            return self._made[key]
        return super().arg(expr)

    def _defer(self, var, u, p):
        if p == _identity(len(p)):
            self.env[var] = u
            return u  # emitted as is (a var or constant: nothing new is bound)
        self.views[var] = (u, p)
        return DEFER

    def rewrite(self, var, value):
        op = op_name(value)
        if op == "relax.permute_dims":
            if self.from_convs and value.args[0] not in self.views \
                    and not _channels_last_conv(self.producer(self.subst(value.args[0]))):
                return None
            u, p = self.view(value.args[0])
            if p is None:
                return None
            axes = value.attrs.axes
            axes = list(axes) if axes is not None else list(reversed(range(len(p))))
            r = tuple(p[int(a) % len(p)] for a in axes)
            if r == _identity(len(r)) and p != r:
                self.pairs += 1
            return self._defer(var, u, r)
        if op in _UNARY:
            u, p = self.view(value.args[0])
            if p is None or p == _identity(len(p)):
                return None
            rest = [self.arg(a) for a in value.args[1:]]
            w = self.emit(relax.Call(value.op, [u, *rest], value.attrs, value.ty_args),
                          var.name)
            return self._defer(var, w, p)
        if op in _NARY:
            return self._nary(var, value)
        if op in _REDUCE or op in _ARG_REDUCE:
            return self._reduce(var, value, op)
        if op in _SOFTMAX:
            u, p = self.view(value.args[0])
            if p is None or p == _identity(len(p)):
                return None
            fn = relax.op.nn.softmax if op == "relax.nn.softmax" else relax.op.nn.log_softmax
            w = self.emit(fn(u, axis=p[int(value.attrs.axis) % len(p)]), var.name)
            return self._defer(var, w, p)
        if self.nhwc and op in _LAYOUT_OPS:
            return self._to_nhwc(var, value, op)
        if op == "relax.strided_slice":
            return self._slice(var, value)
        if op == "relax.squeeze":
            return self._squeeze(var, value)
        return None

    def _nary(self, var, value):
        views = [self.view(a) for a in value.args]
        if any(p is None for _, p in views):
            return None
        moved = [(int(np.prod(shape_of(u))), p) for u, p in views
                 if p != _identity(len(p)) and len(p)]
        if not moved:
            return None
        p = max(moved, key=lambda m: m[0])[1]
        n = len(p)
        args = []
        for (u, q), old in zip(views, value.args):
            c = const_value(u)
            if q == p or q == ():
                args.append(u)  # same view, or a scalar (PrimValue / rank 0)
            elif c is not None and c.ndim <= n:
                c = c.reshape((1,) * (n - c.ndim) + c.shape).transpose(_inverse(p))
                args.append(relax.const(np.array(c, order="C"), str(c.dtype)))
            elif c is None and int(np.prod(shape_of(u))) == 1 and len(q) <= n:
                args.append(u)  # a scalar broadcasts the same in any layout
            else:
                return None  # would need a new transpose of a computed operand
        w = self.emit(relax.Call(value.op, args, value.attrs, value.ty_args), var.name)
        return self._defer(var, w, p)

    def _reduce(self, var, value, op):
        u, p = self.view(value.args[0])
        if p is None or p == _identity(len(p)):
            return None
        n = len(p)
        axis = value.attrs.axis
        keep = bool(value.attrs.keepdims)
        fn = getattr(relax.op, op.split(".")[-1])
        if axis is None:
            return self.emit(fn(u, None, keep), var.name)
        axes = [int(a) % n for a in (axis if not isinstance(axis, (int, tvm.tirx.IntImm))
                                     else [axis])]
        new_axes = sorted(p[a] for a in axes)
        single = op in _ARG_REDUCE
        w = self.emit(fn(u, new_axes[0] if single else new_axes, keep), var.name)
        if keep:
            return self._defer(var, w, p)
        kept_src = sorted(set(range(n)) - set(new_axes))
        r = tuple(kept_src.index(p[i]) for i in range(n) if i not in axes)
        return self._defer(var, w, r)

    def _slice(self, var, value):
        """A slice of a view slices ``u`` along the permuted axes; one that keeps every
        element (tf2onnx's ``x[:, :, :, 0:1]`` of a unit axis) is the view itself."""
        u, p = self.view(value.args[0])
        if p is None or p == _identity(len(p)):
            return None
        ints = [_int_tuple(a) for a in value.args[1:5]]
        if len(ints) == 3 and ints[0] is not None:  # no strides: every one 1
            ints.append([1] * len(ints[0]))
        if len(ints) != 4 or any(x is None for x in ints):
            return None
        axes, begin, end, strides = ints
        shape = shape_of(value.args[0])
        if shape is not None and all(
                b == 0 and e >= shape[a] and s == 1
                for a, b, e, s in zip(axes, begin, end, strides)):
            return self._defer(var, u, p)
        w = self.emit(relax.op.strided_slice(
            u, [p[a % len(p)] for a in axes], begin, end, strides,
            bool(value.attrs.assume_inbound) if value.attrs is not None else False),
            var.name)
        return self._defer(var, w, p)

    def _squeeze(self, var, value):
        """A squeeze of a view squeezes the same axes of ``u``; the view drops them."""
        u, p = self.view(value.args[0])
        shape = shape_of(value.args[0])
        if p is None or p == _identity(len(p)) or shape is None:
            return None
        n = len(p)
        axis = value.attrs.axis
        axes = (sorted(int(a) % n for a in axis) if axis is not None
                else [i for i in range(n) if shape[i] == 1])
        src = sorted(p[a] for a in axes)
        w = self.emit(relax.op.squeeze(u, src), var.name)
        kept_src = sorted(set(range(n)) - set(src))
        return self._defer(var, w, tuple(kept_src.index(p[i]) for i in range(n)
                                         if i not in axes))

    def _to_nhwc(self, var, value, op):
        u, p = self.view(value.args[0])
        a = value.attrs
        layout = a.data_layout if op == "relax.nn.conv2d" else a.layout
        if p != _NHWC_VIEW or layout != "NCHW" or (a.out_layout or layout) != "NCHW":
            return None
        if op == "relax.nn.conv2d":
            new = relax.op.nn.conv2d(u, self.arg(value.args[1]), a.strides, a.padding,
                                     a.dilation, a.groups, "NHWC", a.kernel_layout, "NHWC",
                                     a.out_dtype if str(a.out_dtype) else None)
        elif op == "relax.nn.adaptive_avg_pool2d":
            new = relax.op.nn.adaptive_avg_pool2d(u, a.output_size, "NHWC", "NHWC")
        else:
            fn = getattr(relax.op.nn, op.split(".")[-1])
            new = fn(u, a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode,
                     a.count_include_pad, "NHWC", "NHWC")
        self.nhwc_ops += 1
        return self._defer(var, self.emit(new, var.name), _NHWC_VIEW)


def _channels_last_conv(expr) -> bool:
    return op_name(expr) in ("relax.nn.conv1d", "relax.nn.conv2d") \
        and str(expr.attrs.data_layout) in ("NWC", "NHWC")


def _int_tuple(expr) -> list[int] | None:
    """The integers of a Relax tuple of constants (a slice's bounds), else None."""
    fields = getattr(expr, "fields", None)
    if fields is None:
        return None
    out = []
    for f in fields:
        v = f.value if isinstance(getattr(f, "value", None), tvm.tirx.IntImm) else f
        if not isinstance(v, tvm.tirx.IntImm):
            return None
        out.append(int(v.value))
    return out


_LAYOUT_OPS = frozenset({"relax.nn.conv2d", "relax.nn.max_pool2d", "relax.nn.avg_pool2d",
                         "relax.nn.adaptive_avg_pool2d"})
