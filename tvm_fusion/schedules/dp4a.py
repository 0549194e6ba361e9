"""Default CUDA schedule of an integer GEMM: DP4A (``__dp4a``) on its packed weight.

:mod:`tvm_fusion.simplify.qdq` writes ``u8 x s8 -> i32`` matmuls with a constant weight
as ``T_matmul_packed`` (weight ``(N/16, K/4, 16, 4)``: 4 consecutive K of one column are
4 contiguous bytes). dlight's Matmul rule does not recognise that form, and its int8
Tensor Core path needs ``int8 x int8`` (and crashes TVM 0.27's software pipelining), so
without this rule an int8 GEMM on a GPU is a scalar loop. Here each thread owns one
output, the 4-wide K tile is tensorized with TVM's ``dp4a_u8s8s32`` intrinsic (operands
staged in shared memory, as its description requires), the accumulator stays in a
register, and every other block of the fused kernel (zero point, scales, requantize) is
inlined or runs one element per thread.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from ..family import family_of
from ..compat.fast_import import import_tensor_intrinsics

BLOCK = "T_matmul_packed"
_ROWS, _COLS = 8, 32  # threads per block: 8 rows x 32 columns of the output


class PackedInt8Dp4a:
    """A dlight-style rule: ``apply(func, target, tunable)`` -> Schedule or None."""

    def apply(self, func, target, _tunable=False):  # noqa: D102 - dlight's interface
        if not family_of(target).dp4a_int8:
            return None
        sch = s_tir.Schedule(func)
        try:
            blk = sch.get_sblock(BLOCK)
        except Exception:  # noqa: BLE001 - no packed int8 GEMM in this kernel
            return None
        import_tensor_intrinsics()
        others = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))
                  if sch.get(b).name_hint != BLOCK]
        kept = []
        for name in others[:-1]:  # the epilogue's intermediate steps, into the last one
            try:
                sch.compute_inline(sch.get_sblock(name))
            except Exception:  # noqa: BLE001 - kept as its own loop nest below
                kept.append(name)
        kept += others[-1:]
        loops = sch.get_loops(blk)
        if len(loops) < 4:
            return None
        *spatial, k_o, k_i = loops
        row = sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0]
        col = spatial[-1]
        mo, mi = sch.split(row, [None, _ROWS])
        no, ni = sch.split(col, [None, _COLS])
        sch.reorder(mo, no, mi, ni, k_o, k_i)
        for loop, axis in ((mo, "blockIdx.y"), (no, "blockIdx.x"),
                           (mi, "threadIdx.y"), (ni, "threadIdx.x")):
            sch.bind(loop, axis)
        acc = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(acc, ni)
        for index in (0, 1):  # the dp4a description reads both operands from shared
            sch.compute_at(sch.cache_read(blk, index, "shared"), k_o)
        sch.decompose_reduction(blk, k_o)
        sch.tensorize(k_i, "dp4a_u8s8s32")
        for name in kept:  # one element per thread
            fused = sch.fuse(*sch.get_loops(sch.get_sblock(name)))
            bx, tx = sch.split(fused, [None, _ROWS * _COLS])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
        return sch
