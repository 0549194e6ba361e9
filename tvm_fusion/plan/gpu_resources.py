"""Registers, shared memory and threads of a fused group's GPU kernel.

An untuned GPU kernel is scheduled by dlight's default rules (tvm.s_tir.dlight.gpu:
Matmul, GEMV, Reduction, GeneralReduction, Fallback); :func:`gpu_resources` classifies
a group as those rules would and predicts what its kernel holds. The estimate is the
planner's starting point: where the kernel has been compiled (nvcc's ptxas report, the
gfx90a code object's metadata; :mod:`tvm_fusion.gpu.resources`), the compiler's numbers
replace it (``AnalyticalCostModel(..., compiled=...)``) and the plan's reasons say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..family import strategy
from .op_info import tvm_bits

# The default GPU schedule of an untuned kernel is dlight's (tvm.s_tir.dlight.gpu: Matmul,
# GEMV, Reduction, GeneralReduction, Fallback); these constants mirror its CUDA configs.
DLIGHT_GEMM_BLOCK = (16, 8)      # threads (y, x) of dlight's Matmul rule on cuda/rocm
DLIGHT_GEMM_MICRO = (4, 4, 16)   # per-thread micro tile (y, x) and the k step
DLIGHT_GEMM_PAD = 2              # storage_align offset (the vector size) on each row
DLIGHT_REDUCE_THREADS = 256      # dlight's GEMV / GeneralReduction block size on cuda
WMMA_MIN_EXTENT = 64             # dlight tensorizes only when every extent is > 64
WMMA_BLOCK = (16, 32)            # dlight's WMMA path: 16 warps (threadIdx.y) x 32 lanes
WMMA_TILE = (128, 128, 64)       # block tile M, N, K: 2 x 4 wmma 16x16x16 per dim, 4 k steps
WMMA_PAD = 8                     # storage_align offset of each staged row (fp16 elements)
WMMA_STAGES = 2                  # its software pipeline double-buffers A and B
# schedules/mfma.py on CDNA: 4 waves x 64 lanes, block tile 64 x 64 x 32, A and B staged in LDS
# and the fp32 accumulators returned through it (8 + 16 KiB); same extent threshold
MFMA_THREADS = 256
MFMA_SHARED = (64 + 64) * 32 * 2 + 64 * 64 * 4
MFMA_ARCHS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942")  # CDNA 1-3
GEMM_SCHEDULES = ("gemm", "gemm-tensorcore", "gemm-mfma")
# Registers per thread: calibrated on nvcc 13.0's ptxas for sm_80 and sm_90 against the
# kernels of the embedded model and MiniLM-L3 (tests/test_gpu.py re-checks them):
# simt GEMM 56-72 (16 accumulators, 2 x 8 operand values, addressing), WMMA GEMM 116
# (4 accumulator fragments of 8 fp32, operand fragments), reductions 15-28, elementwise
# Fallback 8-32, the plain-loop kernels of a split group 8-64. Registers depend on
# ptxas, not only on the schedule: the exact-schedule classes carry a tolerance
# (GPU_REGISTER_TOLERANCE), the Fallback ones are upper bounds.
GEMM_REGISTERS = 64
WMMA_REGISTERS = 112
MFMA_REGISTERS = 52              # gfx90a: 48-50 VGPRs (MiniLM-L3's GEMMs); 81-95 with erf
REDUCE_REGISTERS = 24
FALLBACK_REGISTERS = 32          # an upper bound: plain elementwise loops use 8-32
SPLIT_REGISTERS = 64             # an upper bound: a plain-loop GEMM stage uses up to 64
GPU_REGISTER_TOLERANCE = 16      # |nvcc - estimate| registers, for exact-schedule classes


@dataclass(frozen=True, kw_only=True)
class GpuResources:
    """Predicted resources of a group's kernel under dlight's default GPU schedule.

    Attributes
    ----------
    schedule : str
        ``gemm`` (dlight Matmul, SIMT), ``gemm-mfma`` (CDNA matrix cores:
        :class:`tvm_fusion.schedules.mfma.RocmMfmaMatmul`), ``gemm-tensorcore`` (dlight's
        WMMA path: fp16 operands, every extent > 64, sm_70+), ``reduction`` (GEMV / Reduction /
        GeneralReduction: one block per row), ``elementwise`` (Fallback) or ``split``:
        dlight has no rule for the fused group (a contraction with a reduction epilogue,
        two contractions), so Fallback emits one plain kernel per stage and the fusion the
        planner counted on is lost unless a tuned schedule replaces it.
    kernels : int
        Kernels the default schedule launches (``split``: at least this many).
    threads_per_block, registers_per_thread, shared_bytes : int
        Per kernel. ``shared_bytes`` is exact for ``gemm``; for ``reduction`` an upper
        bound (staging per warp, 64-byte aligned arrays). On gfx90a the registers are
        VGPRs per lane, AGPRs included.
    spill_bytes : int
        Bytes per thread the compiler spilled to local memory / scratch (stored and
        loaded back); 0 in an estimate.
    source : str
        Where the numbers come from: ``""`` this module's estimate, else the compiler
        that allocated them (``"ptxas sm_80"``, ``"gfx90a code object"``; see
        :mod:`tvm_fusion.gpu.resources`), which wins over the estimate.
    estimated_registers, estimated_schedule : int, str
        With a compiler ``source``: the registers and the dlight rule's class the
        estimate had assumed (``schedule`` is then the rule that really scheduled it).
    """

    schedule: str
    kernels: int
    threads_per_block: int
    registers_per_thread: int
    shared_bytes: int
    spill_bytes: int = 0
    source: str = ""
    estimated_registers: int = 0
    estimated_schedule: str = ""

    @property
    def registers_per_block(self) -> int:
        """Registers one block holds."""
        return self.registers_per_thread * self.threads_per_block


def gpu_resources(model: "AnalyticalCostModel", nodes: Iterable[int]) -> GpuResources:
    """Registers, shared memory and threads per block of a group on a GPU target.

    The group is classified as dlight's default rules would schedule its fused PrimFunc
    (module constants above). A contraction with out rows M = prod(shape[:-1]) > 1
    and nothing else reducing is dlight's tiled Matmul: 128 threads, each a 4 x 4 micro
    tile; shared memory holds a 64 x 16 tile of A and a 32 x 16 tile of B, rows padded by
    the vector size: ``(64 + 32) * (16 + 2) * operand bytes`` (6912 B in fp32). Tensor
    cores (fp16 operands, M, N, K > 64, cuda sm_70+): dlight's WMMA path, 512 threads,
    a 128 x 128 block tile, k step 64, A and B staged in fp16 with 8-element row padding
    and double-buffered: ``2 * (128 + 128) * (64 + 8) * 2`` bytes (72 KB, dynamic shared
    memory: above the 48 KB static limit, within A100's 163 KB opt-in).
    A GEMV (M = 1) or row reduction: 256 threads (a single-pass sum or mean over the
    innermost axes: dlight's Reduction rule, up to 1024 on cuda), one partial sum per
    thread in shared memory at most (``threads * 4`` B). Elementwise: the target's max
    threads, no shared memory. Anything else is ``split`` (see :class:`GpuResources`).
    """
    hw = model.hw
    members = sorted(set(nodes))
    roles = [model.infos[n].role for n in members]
    # a contraction with one output row (a GEMV: M = 1) is a row reduction to dlight
    contractions = [n for n, r in zip(members, roles)
                    if r == "contraction" and _contraction_rows(model, n) > 1]
    reductions = [n for n, r in zip(members, roles)
                  if r == "reduction" or (r == "contraction" and n not in contractions)]
    max_threads = int(hw.tvm_config.get("max_threads_per_block", hw.max_threads_per_block))
    # a multi-output op (Split): each of its results is a root block of the fused PrimFunc
    # and a kernel of its own, under every dlight rule; so is each output of a group with a
    # contraction or reduction, which is one kernel more (nvcc and the AMDGPU backend
    # both: MiniLM's Q/K/V matmul + bias + split became 4 kernels on sm_80 and gfx90a,
    # whatever reshapes joined it; PP-OCR rec's attention matmul with 2 or 3 strided-slice
    # outputs became 3 or 4; a reduction's second output is not counted: duplicated
    # prologues read by two reductions stay inside each)
    pieces = sum(len(model.graph.nodes[n].results) for n in members
                 if len(model.graph.nodes[n].results) > 1)
    outs = 0 if not contractions else sum(
        model.escapes(n, members) if len(model.graph.nodes[n].results) <= 1 else
        sum(model.result_escapes((n, k), members)
            for k in range(len(model.graph.nodes[n].results))) for n in members)
    if (contractions or reductions) and max(pieces, outs) > 1:
        return GpuResources(schedule="split", kernels=max(pieces, outs) + 1,
                            threads_per_block=max_threads,
                            registers_per_thread=SPLIT_REGISTERS, shared_bytes=0)
    if not contractions and not reductions:
        return GpuResources(schedule="elementwise", kernels=max(pieces, 1),
                            threads_per_block=max_threads,
                            registers_per_thread=FALLBACK_REGISTERS, shared_bytes=0)
    if contractions and (len(contractions) > 1 or reductions):
        passes = sum(max(model.infos[n].passes, 1) for n in reductions)
        return GpuResources(schedule="split", kernels=len(contractions) + passes + 1,
                            threads_per_block=max_threads,
                            registers_per_thread=SPLIT_REGISTERS, shared_bytes=0)
    if reductions:
        threads = _inner_reduction_threads(model, reductions, hw) or DLIGHT_REDUCE_THREADS
        return GpuResources(schedule="reduction", kernels=1, threads_per_block=threads,
                            registers_per_thread=REDUCE_REGISTERS, shared_bytes=threads * 4)
    nid = contractions[0]
    node, info = model.graph.nodes[nid], model.infos[nid]
    shape = [int(d) for d in node.shape] or [1]
    conv = _is_conv(node)
    n_out = shape[1] if conv else shape[-1]
    rows = _contraction_rows(model, nid)
    dtype = model.operand_dtype(nid)
    arch = str(hw.tvm_config.get("arch", ""))
    sm = int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0
    i_ext = rows if conv or len(shape) < 2 else shape[-2]
    if (dtype == "float16" and sm >= 70
            and min(i_ext, n_out, info.reduce_len) > WMMA_MIN_EXTENT):
        (ty, tx), (bm, bn, bk), pad, stages = WMMA_BLOCK, WMMA_TILE, WMMA_PAD, WMMA_STAGES
        return GpuResources(schedule="gemm-tensorcore", kernels=1, threads_per_block=ty * tx,
                            registers_per_thread=WMMA_REGISTERS,
                            shared_bytes=stages * (bm + bn) * (bk + pad) * 2)
    if (dtype == "float16" and str(hw.tvm_config.get("mcpu", "")) in MFMA_ARCHS
            and strategy(hw).mfma and min(i_ext, n_out, info.reduce_len) > WMMA_MIN_EXTENT):
        return GpuResources(schedule="gemm-mfma", kernels=1, threads_per_block=MFMA_THREADS,
                            registers_per_thread=MFMA_REGISTERS, shared_bytes=MFMA_SHARED)
    by, bx = DLIGHT_GEMM_BLOCK
    my, mx, mk = DLIGHT_GEMM_MICRO
    nbytes = max(tvm_bits(dtype) // 8, 1)
    return GpuResources(schedule="gemm", kernels=1, threads_per_block=by * bx,
                        registers_per_thread=GEMM_REGISTERS,
                        shared_bytes=(by * my + bx * mx) * (mk + DLIGHT_GEMM_PAD) * nbytes)


def _inner_reduction_threads(model, reductions, hw) -> int | None:
    """Threads of dlight's Reduction rule for one single-pass reduction over the
    innermost axes of a computed tensor (a sum, a mean): the largest power of two up to
    the row length and 1024 (cuda) or 256 (rocm), as its suggest_threads_per_block
    gives; None for the other cases (GEMV, softmax, layer norm: 256 threads)."""
    if len(reductions) != 1:
        return None
    nid = reductions[0]
    info, node = model.infos[nid], model.graph.nodes[nid]
    if info.role != "reduction" or info.passes != 1 or not node.inputs:
        return None
    trailing = 1
    for dim in reversed(model.graph.nodes[node.inputs[0]].shape):
        if trailing >= info.reduce_len:
            break
        trailing *= int(dim)
    if trailing != info.reduce_len:  # reduces an outer axis: another dlight schedule
        return None
    cap = strategy(hw).reduction_max_threads
    return 1 << (min(info.reduce_len, cap).bit_length() - 1)


def _is_conv(node) -> bool:
    return node.op.startswith("conv") and len(node.shape) >= 3


def _contraction_rows(model, nid: int) -> int:
    """Output rows of a contraction as dlight normalizes it to C[batch, I, J]: J is a
    conv's output channels (NCHW) or a matmul's last dim, the rows are the rest."""
    node = model.graph.nodes[nid]
    shape = [int(d) for d in node.shape] or [1]
    n_out = shape[1] if _is_conv(node) else shape[-1]
    return model.infos[nid].out_elems // max(n_out, 1)
