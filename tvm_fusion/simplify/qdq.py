"""QDQ and integer GEMMs as integer kernels: ``u8 x s8 -> i32`` convolutions and matmuls.

TVM's importer turns ``DequantizeLinear -> Conv/MatMul`` into a float32 GEMM over
dequantized operands, so a QDQ model runs as a float model with extra ops. Here

- ``conv2d(dequantize(xq, sx, zx), dequantize(wq, sw, 0))`` (NCHW/OIHW, a constant
  int8 weight, per-tensor or per-output-channel scale) becomes
  ``float(conv2d(pad(xq, zx), wq) -> int32 - zx * sum(wq[o])) * (sx * sw[o])``;
- ``matmul(dequantize(aq, sa, za), dequantize(bq, sb, 0))`` and MatMulInteger's
  ``matmul(astype(aq) - za, astype(bq) - 0)`` become
  ``matmul(aq, bq) -> int32 - za * colsum(bq)`` (then the scales, for the QDQ form).

The integer product is exact, the zero point of the activation is a per-channel
correction (the padding carries the zero point, so it stays exact at the borders), and
the scales go to the epilogue, where the planner fuses them with what follows (bias,
batch norm, activation, requantize). The GEMM reads its uint8/int8 operands directly:
the form of MetaSchedule's VNNI / DP4A intrinsics.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from .block import BlockRewriter, const_value, dtype_of, op_name

_INT8 = ("int8", "uint8")


def _scalar(expr) -> np.ndarray | None:
    """The value of a constant with one element, else None."""
    v = const_value(expr)
    return v.reshape(()) if v is not None and v.size == 1 else None


class QdqIntegerizer(BlockRewriter):
    """See the module docstring; ``convs`` and ``matmuls`` count the rewritten GEMMs."""

    def __init__(self, mod):
        super().__init__(mod)
        self.convs = 0
        self.matmuls = 0

    def run(self):
        mod = super().run()
        if self.bb is None:
            return mod
        # The packed-weight PrimFuncs live in the builder's module; keep them.
        funcs = dict(mod.functions.items())
        for gv, f in self.bb.get().functions.items():
            if gv.name_hint != "main":
                funcs.setdefault(gv, f)
        out = tvm.IRModule(funcs, attrs=mod.attrs)
        return out

    def _dq(self, expr):
        """``(data, scale, zp, axis)`` of a ``relax.dequantize`` of int8/uint8 data, or None."""
        new = self.producer(self.arg(expr))
        if op_name(new) == "relax.reshape":  # a per-tensor dequantize commutes with it
            inner = self._dq(new.args[0])
            if inner is None or _scalar(inner[1]) is None or _scalar(inner[2]) is None:
                return None
            return (self.emit(relax.op.reshape(inner[0], new.args[1]), "qreshape"),
                    *inner[1:])
        if op_name(new) != "relax.dequantize" or dtype_of(new.args[0]) not in _INT8 \
                or str(new.attrs.out_dtype) != "float32":
            return None
        return new.args[0], new.args[1], new.args[2], int(new.attrs.axis)

    def rewrite(self, var, value):
        op = op_name(value)
        if op == "relax.nn.conv2d":
            return self._conv(value)
        if op == "relax.matmul":
            return self._matmul(value)
        return None

    # ---- conv2d ----------------------------------------------------------------------
    def _conv(self, call):
        attrs = call.attrs
        if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
            return None
        x, w = self._dq(call.args[0]), self._dq(call.args[1])
        if x is None or w is None:
            return None
        wq, sw, zw = const_value(w[0]), const_value(w[1]), const_value(w[2])
        sx, zx = _scalar(x[1]), _scalar(x[2])
        if wq is None or sw is None or zw is None or sx is None or zx is None \
                or np.any(zw != 0) or wq.dtype != np.int8 \
                or not (sw.size == 1 or (w[3] == 0 and sw.size == wq.shape[0])):
            return None
        xq, zx = x[0], int(zx)
        pads = [int(p) for p in attrs.padding]  # top, left, bottom, right
        if zx and any(pads):
            xq = self.emit(relax.op.nn.pad(xq, [0, 0, 0, 0, pads[0], pads[2], pads[1], pads[3]],
                                           pad_value=float(zx)), "qpad")
            pads = [0, 0, 0, 0]
        acc = self.emit(relax.op.nn.conv2d(
            xq, w[0], strides=attrs.strides, padding=pads, dilation=attrs.dilation,
            groups=int(attrs.groups), data_layout="NCHW", kernel_layout="OIHW",
            out_dtype="int32"), "qconv")
        out_ch = wq.shape[0]
        if zx:
            corr = (zx * wq.reshape(out_ch, -1).astype(np.int64).sum(1)).astype(np.int32)
            acc = self.emit(relax.op.subtract(acc, relax.const(corr.reshape(1, -1, 1, 1))),
                            "qzp")
        scale = (np.float32(sx) * np.broadcast_to(sw.astype(np.float32).reshape(-1), (out_ch,)))
        self.convs += 1
        return relax.op.multiply(self.emit(relax.op.astype(acc, "float32"), "qacc"),
                                 relax.const(scale.astype(np.float32).reshape(1, -1, 1, 1)))

    # ---- matmul ----------------------------------------------------------------------
    def _matmul(self, call):
        a, b = self._dq(call.args[0]), self._dq(call.args[1])
        if a is not None and b is not None:
            return self._qdq_matmul(a, b)
        if str(call.attrs.out_dtype) == "int32":
            return self._integer_matmul(call)
        return None

    def _weight(self, bq, zb):
        """The int8 weight (K, N) as an array when its zero point is 0, else None."""
        w, z = const_value(bq), const_value(zb)
        if w is None or z is None or w.dtype != np.int8 or w.ndim != 2 or np.any(z != 0):
            return None
        return w

    def _packed_matmul(self, aq, w):
        """``aq @ w`` in int32 with ``w`` packed as ``(N/16, K/4, 16, 4)``: the layout of
        MetaSchedule's VNNI intrinsic (``dot_16x4_vnni``, which tensorizes only a compact
        16 x 4 weight tile; a row-major (K, N) weight never matches it). None when K is
        not a multiple of 4."""
        k, n = w.shape
        if k % 4 or dtype_of(aq) != "uint8":
            return None
        n16 = -(-n // 16) * 16
        padded = np.zeros((k, n16), np.int8)
        padded[:, :n] = w
        packed = np.ascontiguousarray(padded.reshape(k // 4, 4, n16 // 16, 16).transpose(2, 0, 3, 1))
        a_shape = [int(d) for d in aq.ty.shape.values]
        i64 = lambda v: tvm.tirx.IntImm("int64", v)  # noqa: E731 - shapes as legalized ops have them
        a_ph = te.placeholder([i64(d) for d in a_shape], "uint8", name="A")
        w_ph = te.placeholder([i64(d) for d in packed.shape], "int8", name="W")
        ko = te.reduce_axis((i64(0), i64(k // 4)), "ko")
        ki = te.reduce_axis((i64(0), i64(4)), "ki")
        out = te.compute([i64(d) for d in (*a_shape[:-1], n)], lambda *i: te.sum(
            a_ph[(*i[:-1], ko * 4 + ki)].astype("int32")
            * w_ph[i[-1] // 16, ko, i[-1] % 16, ki].astype("int32"), axis=[ko, ki]),
            name="T_matmul_packed")
        # kOutEWiseFusable, as TVM's matmul: a GEMM whose epilogue the planner fuses.
        func = te.create_prim_func([a_ph, w_ph, out]).with_attr("op_pattern", 4) \
            .without_attr("global_symbol")  # private, as legalized PrimFuncs are
        gvar = self.bb.add_func(func, "matmul")
        return relax.call_tir(gvar, [aq, relax.const(packed)],
                              relax.TensorType((*a_shape[:-1], n), "int32"))

    def _corrected(self, aq, bq, w, za):
        packed = self._packed_matmul(aq, w)
        acc = self.emit(packed if packed is not None else
                        relax.op.matmul(aq, bq, out_dtype="int32"), "qmatmul")
        colsum = relax.const(w.astype(np.int64).sum(0).astype(np.int32))
        za_v = _scalar(za)
        if za_v is not None:
            if int(za_v) == 0:
                return acc
            return relax.op.subtract(acc, relax.const(
                (int(za_v) * w.astype(np.int64).sum(0)).astype(np.int32)))
        za32 = self.emit(relax.op.astype(za, "int32"), "qza")
        return relax.op.subtract(acc, self.emit(relax.op.multiply(za32, colsum), "qzp"))

    def _qdq_matmul(self, a, b):
        w = self._weight(b[0], b[2])
        sa, sb = _scalar(a[1]), const_value(b[1])
        if w is None or sa is None or sb is None or a[3] != 0 and const_value(a[1]).size > 1 \
                or not (sb.size == 1 or sb.size == w.shape[1]):
            return None
        if const_value(a[2]) is None:
            return None
        acc = self.emit(self._corrected(a[0], b[0], w, a[2]), "qacc32")
        self.matmuls += 1
        scale = (np.float32(sa) * sb.astype(np.float32).reshape(-1)).astype(np.float32)
        return relax.op.multiply(self.emit(relax.op.astype(acc, "float32"), "qacc"),
                                 relax.const(scale))

    def _integer_matmul(self, call):
        """MatMulInteger as TVM converts it: int32 operands minus their zero points."""
        lhs, rhs = self.producer(self.arg(call.args[0])), self.producer(self.arg(call.args[1]))
        a = self._widened(lhs)
        b = self._widened(rhs)
        if a is None or b is None:
            return None
        w = self._weight(b[0], b[1])
        if w is None:
            return None
        self.matmuls += 1
        return self._corrected(a[0], b[0], w, a[1])

    def _widened(self, expr):
        """``(x8, zp)`` of ``astype(x8, int32) - astype(zp, int32)`` or of
        ``astype(x8, int32)`` (zp 0), else None."""
        zp = relax.const(np.int8(0))
        if op_name(expr) == "relax.subtract":
            widened_zp = self.producer(expr.args[1])
            if op_name(widened_zp) == "relax.astype":
                zp = widened_zp.args[0]
            elif const_value(widened_zp) is not None:
                zp = widened_zp
            else:
                return None
            expr = self.producer(expr.args[0])
        if op_name(expr) != "relax.astype" or dtype_of(expr.args[0]) not in _INT8:
            return None
        zp_shape = getattr(getattr(zp, "ty", None), "shape", None)
        if zp_shape is not None and hasattr(zp_shape, "values") and len(zp_shape.values) > 0 \
                and const_value(zp) is None:
            return None  # a per-row zero point at run time: left to the stock form
        return expr.args[0], zp
