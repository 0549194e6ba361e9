"""Blocked int8 convolutions in the form of TVM's ``conv2d_NCHWc_int8`` (VNNI's layout).

An integer conv (``u8 x s8 -> i32``, :mod:`tvm_fusion.simplify.qdq`) blocked as
``NCHW16c`` / ``OIHW16o`` by :func:`~tvm_fusion.graph.layout.convert_layout` still
reads its weight with input channels strided, so no VNNI ``vpdpbusd`` (16 output
lanes x 4 consecutive input channels) can run it. Here such a conv (groups 1, a
constant weight, 16-channel blocks) becomes a ``call_tir`` of the compute of
``topi.nn.conv2d_NCHWc_int8`` (TVM's x86 int8 conv), with the weight repacked
once, at plan time, to its ``(O/16, I/16, KH, KW, 4, 16, 4)`` layout: 4 consecutive
input channels of one output channel are adjacent, the 16 x 4 tile the VNNI intrinsic
tensorizes (``schedules/vnni.schedule_conv_vnni`` without a record; MetaSchedule's
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


def _conv_func(data_shape, kernel_shape, strides, padding, dilation, nchw=False) -> tuple:
    """The compute of ``topi.nn.conv2d_NCHWc_int8`` (groups 1, 4 channels a lane) over
    int64 axes, as legalized ops have them (topi's output shape is int32, and FuseTIR
    maps buffers by their type); returns ``(PrimFunc, output shape)``. With ``nchw``
    the output is unblocked to NCHW in the same PrimFunc (a reindexing after a conv is
    no epilogue the planner fuses: legality.py)."""
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
    shape = [n, oc_chunk, oh_, ow_, oc_bn]
    if nchw:
        blocked = out
        shape = [n, oc_chunk * oc_bn, oh_, ow_]
        out = te.compute([i64(d) for d in shape], lambda b, o, y, x: blocked[
            b, o // oc_bn, y, x, o % oc_bn], name="T_unblock")
    # kOutEWiseFusable, as TVM's conv2d: a GEMM whose epilogue the planner fuses
    return te.create_prim_func([data, weight, out]).with_attr("op_pattern", 4) \
        .without_attr("global_symbol"), shape


def _applies(call: relax.Call, kernel: np.ndarray) -> bool:
    attrs = call.attrs
    data = call.args[0].ty
    return (str(attrs.data_layout) == f"NCHW{LANES}c" and str(attrs.out_layout) == str(attrs.data_layout)
            and str(attrs.kernel_layout) == f"OIHW{LANES}o" and int(attrs.groups) == 1
            and str(attrs.out_dtype) == "int32" and str(data.dtype) == "uint8"
            and kernel.dtype == np.int8 and kernel.ndim == 5 and kernel.shape[1] % LANES == 0
            and data.shape is not None
            and all(isinstance(d, tvm.tirx.IntImm) for d in data.shape.values))


def packed_stem_weight(kernel: np.ndarray) -> np.ndarray:
    """An ``OIHW`` int8 weight on ``C < 16`` input channels as ``(O/16, 1, KH, KW, C4/4,
    16, 4)``, ``C4`` the channels padded to a multiple of 4 with zero weights (so
    whatever the padded input channel holds adds nothing)."""
    o, c, kh, kw = kernel.shape
    c4 = -(-c // GROUP) * GROUP
    padded = np.zeros((o, c4, kh, kw), np.int8)
    padded[:, :c] = kernel
    blocks = padded.reshape(o // LANES, LANES, 1, c4 // GROUP, GROUP, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 5, 6, 3, 1, 4))


def _is_stem(call: relax.Call, kernel: np.ndarray) -> bool:
    """An NCHW ``u8 x s8 -> i32`` conv on fewer than 16 input channels (an RGB stem,
    which the blocked layout leaves NCHW) with output channels in blocks of 16."""
    attrs = call.attrs
    data = call.args[0].ty
    return (str(attrs.data_layout) == "NCHW" and str(attrs.kernel_layout) == "OIHW"
            and str(attrs.out_layout) in ("NCHW", "") and int(attrs.groups) == 1
            and str(attrs.out_dtype) == "int32" and str(data.dtype) == "uint8"
            and kernel.dtype == np.int8 and kernel.ndim == 4 and kernel.shape[1] < LANES
            and kernel.shape[0] % LANES == 0 and data.shape is not None
            and all(isinstance(d, tvm.tirx.IntImm) for d in data.shape.values))


def _injective(shape_in, dtype, out_shape, index, name) -> tvm.tirx.PrimFunc:
    """``out[j] = x[index(j)]`` (or the pad value 0 where ``index`` gives None) as an
    injective PrimFunc over int64 axes, which the planner fuses with its neighbours."""
    i64 = lambda v: tvm.tirx.IntImm("int64", int(v))  # noqa: E731
    x = te.placeholder([i64(d) for d in shape_in], dtype, name="x")
    out = te.compute([i64(d) for d in out_shape], lambda *j: index(x, *j), name=name)
    return te.create_prim_func([x, out]).with_attr("op_pattern", 2) \
        .without_attr("global_symbol")


def _stem_call(bb, x, kernel: np.ndarray, attrs) -> relax.Expr:
    """The stem conv on VNNI: its input channels padded to a multiple of 4 and blocked
    as one ``NCHW{C4}c`` chunk (4 bytes of a pixel, one ``vpdpbusd`` operand), the
    ``conv2d_NCHWc_int8`` compute, its ``NCHW16c`` output unblocked to NCHW in the
    conv's own PrimFunc for the epilogue (the blocked conv after it blocks it again, in
    the same fused kernel)."""
    n, c, h, w = (int(d) for d in x.ty.shape.values)
    packed = packed_stem_weight(kernel)
    c4 = packed.shape[4] * GROUP
    # the padded channel may hold anything: its weights are 0 (0, not a zero point)
    block = _injective([n, c, h, w], "uint8", [n, 1, h, w, c4], lambda t, a, _, y, z, e:
                       tvm.tirx.if_then_else(e < c, t[a, tvm.tirx.min(e, c - 1), y, z],
                                             tvm.tirx.const(0, "uint8")), "T_stem_block")
    xb = relax.call_tir(bb.add_func(block, "stem_block"), [x],
                        relax.TensorType([n, 1, h, w, c4], "uint8"))
    func, out_shape = _conv_func([n, 1, h, w, c4], packed.shape, [int(v) for v in attrs.strides],
                                 [int(v) for v in attrs.padding], [int(v) for v in attrs.dilation],
                                 nchw=True)
    return relax.call_tir(bb.add_func(func, BLOCK), [xb, relax.const(packed)],
                          relax.TensorType(out_shape, "int32"))


def vnni_form_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each blocked ``u8 x s8 -> i32`` conv2d of ``main`` (see the module
    docstring) as a ``call_tir`` of ``conv2d_NCHWc_int8`` on its repacked weight; the
    others as they are. ``mod`` itself when there is none."""
    bb = relax.BlockBuilder(mod)
    x, w = wildcard(), is_const()
    count = [0]

    def rewrite(expr, m):
        kernel = m[w].value.numpy()
        if _is_stem(expr, kernel):
            count[0] += 1
            return _stem_call(bb, m[x], kernel, expr.attrs)
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
