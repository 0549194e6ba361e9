"""Blocked int8 convolutions in the form of TVM's ``conv2d_NCHWc_int8`` (VNNI's layout).

An integer conv (``u8 x s8 -> i32``, :mod:`tvm_fusion.simplify.qdq`) blocked as
``NCHW16c`` / ``OIHW16o`` by :func:`~tvm_fusion.graph.layout.convert_layout` still
reads its weight with input channels strided, so no VNNI ``vpdpbusd`` (16 output
lanes x 4 consecutive input channels) can run it. Here such a conv (groups 1, a
constant weight, 16-channel blocks) becomes a ``call_tir`` of the compute of
``topi.nn.conv2d_NCHWc_int8`` (TVM's x86 int8 conv), with the weight repacked
once, at plan time, to its ``(O/16, I/16, KH, KW, 4, 16, 4)`` layout: 4 consecutive
input channels of one output channel are adjacent, the 16 x 4 tile the VNNI intrinsic
tensorizes (``tune/vnni.schedule_conv_vnni`` without a record; MetaSchedule's
``MultiLevelTilingWithIntrin`` when tuned). The packing is done before legalization
because the int8 weights are parameters there (``frontend/int_weights.py``), out of
reach of constant folding.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

BLOCK = "conv2d_NCHWc_int8"  # the block topi's compute names
LANES = 16  # output channels per vpdpbusd (zmm of int32)
GROUP = 4  # input channels per int32 lane


def packed_weight(kernel: np.ndarray) -> np.ndarray:
    """An ``OIHW16o`` int8 weight ``(O/16, I, KH, KW, 16)`` as ``(O/16, I/16, KH, KW,
    4, 16, 4)``: input channel ``i = 16 * ic + 4 * f + s`` at ``[.., ic, .., f, o, s]``."""
    occ, ic, kh, kw, ocb = kernel.shape
    blocks = kernel.reshape(occ, ic // LANES, LANES // GROUP, GROUP, kh, kw, ocb)
    return np.ascontiguousarray(blocks.transpose(0, 1, 4, 5, 2, 6, 3))


def _conv_func(data_shape, kernel_shape, strides, padding, dilation) -> tuple:
    """The compute of ``topi.nn.conv2d_NCHWc_int8`` (groups 1, 4 channels a lane) over
    int64 axes, as legalized ops have them (topi's output shape is int32, and FuseTIR
    maps buffers by their type); returns ``(PrimFunc, output shape)``."""
    i64 = lambda v: tvm.tirx.IntImm("int64", int(v))  # noqa: E731
    data = te.placeholder([i64(d) for d in data_shape], "uint8", name="data")
    weight = te.placeholder([i64(d) for d in kernel_shape], "int8", name="kernel")
    n, ic_chunk, ih, iw, _ = data_shape
    oc_chunk, _, kh_, kw_, icf_, oc_bn, ics_ = kernel_shape
    (sh, sw), (dh, dw) = strides, dilation
    top, left, bottom, right = padding
    oh_ = (ih + top + bottom - (kh_ - 1) * dh - 1) // sh + 1
    ow_ = (iw + left + right - (kw_ - 1) * dw - 1) // sw + 1
    padded = data
    if top or left or bottom or right:  # the zero point is 0 here (qdq.py pads others)
        padded = topi.nn.pad(data, (0, 0, top, left, 0), (0, 0, bottom, right, 0),
                             name="data_pad")
    ico = te.reduce_axis((i64(0), i64(ic_chunk)), "ic_outer")
    kh = te.reduce_axis((i64(0), i64(kh_)), "kh")
    kw = te.reduce_axis((i64(0), i64(kw_)), "kw")
    icf = te.reduce_axis((i64(0), i64(icf_)), "ic_f_inner")
    ics = te.reduce_axis((i64(0), i64(ics_)), "ic_s_inner")
    out = te.compute([i64(d) for d in (n, oc_chunk, oh_, ow_, oc_bn)],
                     lambda b, oc, oh, ow, ocb: te.sum(
                         padded[b, ico, oh * sh + kh * dh, ow * sw + kw * dw, icf * ics_ + ics]
                         .astype("int32") * weight[oc, ico, kh, kw, icf, ocb, ics].astype("int32"),
                         axis=[ico, kh, kw, icf, ics]), name=BLOCK)
    # kOutEWiseFusable, as TVM's conv2d: a GEMM whose epilogue the planner fuses
    return te.create_prim_func([data, weight, out]).with_attr("op_pattern", 4) \
        .without_attr("global_symbol"), [n, oc_chunk, oh_, ow_, oc_bn]


def _applies(call: relax.Call, kernel: np.ndarray) -> bool:
    attrs = call.attrs
    data = call.args[0].ty
    return (str(attrs.data_layout) == f"NCHW{LANES}c" and str(attrs.out_layout) == str(attrs.data_layout)
            and str(attrs.kernel_layout) == f"OIHW{LANES}o" and int(attrs.groups) == 1
            and str(attrs.out_dtype) == "int32" and str(data.dtype) == "uint8"
            and kernel.dtype == np.int8 and kernel.ndim == 5 and kernel.shape[1] % LANES == 0
            and data.shape is not None
            and all(isinstance(d, tvm.tirx.IntImm) for d in data.shape.values))


def vnni_form_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each blocked ``u8 x s8 -> i32`` conv2d of ``main`` (see the module
    docstring) as a ``call_tir`` of ``conv2d_NCHWc_int8`` on its repacked weight; the
    others as they are. ``mod`` itself when there is none."""
    bb = relax.BlockBuilder(mod)
    x, w = wildcard(), is_const()
    count = [0]

    def rewrite(expr, m):
        kernel = m[w].value.numpy()
        if not _applies(expr, kernel):
            return expr
        attrs = expr.attrs
        data_shape = [int(d) for d in m[x].ty.shape.values]
        packed = packed_weight(kernel)
        func, out_shape = _conv_func(data_shape, packed.shape, [int(v) for v in attrs.strides],
                          [int(v) for v in attrs.padding], [int(v) for v in attrs.dilation])
        gvar = bb.add_func(func, BLOCK)
        count[0] += 1
        return relax.call_tir(gvar, [m[x], relax.const(packed)],
                              relax.TensorType(out_shape, "int32"))

    main = rewrite_call(is_op("relax.nn.conv2d")(x, w), rewrite, mod["main"])
    if not count[0]:
        return mod
    funcs = dict(bb.get().functions.items())
    funcs[mod.get_global_var("main")] = main
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
