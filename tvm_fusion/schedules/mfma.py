"""Matrix cores on CDNA (MI250X): fp16 GEMMs on MFMA, with their epilogues in the kernel.

dlight's Matmul rule tensorizes fp16 GEMMs for CUDA only (WMMA); on ROCm it schedules
them as plain FMA loops. TVM ships the MFMA tensor intrinsics
(``tvm.s_tir.tensor_intrin.rocm``: ``v_mfma_f32_16x16x16f16`` with its 64-lane fragment
loads, fill and store) but no rule that uses them. :class:`RocmMfmaMatmul` is that rule,
shaped like dlight's ``MatmulTensorization``: the GEMM is normalized to
``C[S, I, J] += A[S, I, K] * B[S, J, K]``, padded to the block tile, its A and B tiles
are staged in LDS, each wave's 16x16 fragments run on MFMA with fp32 accumulators,
which go back through LDS, where the fused epilogue (bias, GELU, casts) is inlined into
the copy to global memory: one kernel.

What TVM has and has not: the fp16 -> fp32 and int8 -> int32 16x16x16 and the fp32
16x16x4 intrinsics. There is no bf16 MFMA intrinsic (``v_mfma_f32_16x16x8bf16_1k``), so
bf16 GEMMs keep dlight's FMA schedule.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (auto_inline_consumer_chain, auto_inline_producers,
                                         get_in_out_dtypes, get_index_map,
                                         get_reduction_blocks)
from tvm.target import Target

from ..family import family_of
from ..plan.gpu_resources import MFMA_ARCHS, WMMA_MIN_EXTENT as MIN_EXTENT

WAVE = 64  # lanes of a CDNA wavefront: one MFMA fragment is spread over a whole wave

_INTRINS: dict[str, str] = {}


def _intrinsics() -> dict[str, str]:
    """Register (once) the fragment intrinsics the rule uses, by role.

    TVM registers the B fragment load from [K, N] and the store to global memory; the
    normalized GEMM reads B as [N, K] and the epilogue reads the accumulators from LDS,
    so the [N, K] load and the LDS store are registered here, built by TVM's own
    intrinsic makers.
    """
    if _INTRINS:
        return _INTRINS
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import rocm

    own = {
        "load_b": ("tvm_fusion_mfma_load_b_16x16_shared_f16_trans",
                   rocm.get_mfma_load_intrin(16, "float16", "shared", is_b=True,
                                             transposed=True)),
        "store": ("tvm_fusion_mfma_store_16x16_f32_shared",
                  rocm.get_mfma_store_intrin(4, "float32", "shared")),
    }
    for name, (desc, impl) in own.values():
        try:
            TensorIntrin.get(name, allow_missing=False)
        except Exception:  # noqa: BLE001  (not registered yet)
            TensorIntrin.register(name, desc, impl)
    _INTRINS.update({role: name for role, (name, _) in own.items()})
    _INTRINS["load_a"] = rocm.ROCM_MFMA_LOAD_16x16_A_SHARED_f16_INTRIN
    _INTRINS["init"] = rocm.ROCM_MFMA_fill_16x16_f32_INTRIN
    # B's fragment holds lane n + 16 (k / 4), slot k % 4: the [K, N] intrinsic's layout
    # (its b_transposed variant indexes B's fragment with the roles of n and k swapped)
    _INTRINS["compute"] = rocm.ROCM_MFMA_f16f16f32_INTRIN
    return _INTRINS


def has_mfma(target: Target) -> bool:
    """Whether ``target`` is a ROCm GPU with matrix cores (CDNA)."""
    return family_of(target).mfma and str(target.attrs.get("mcpu", "")) in MFMA_ARCHS


def _fragment_map(layout):
    """(s, i, j) of a warp buffer -> (s, i/16, j/16, lane, slot) of the MFMA layout."""
    return lambda s, i, j: (s, i // 16, j // 16, *layout(i % 16, j % 16))


class RocmMfmaMatmul(GPUScheduleRule):
    """fp16 GEMM (fp32 accumulation) on CDNA matrix cores; None where it does not apply.

    Block tile 64 x 64 x 32: four waves (256 threads, the target's limit), each a 32 x 32
    tile of four 16 x 16 MFMA fragments; A and B staged in LDS (8 KiB), the fp32
    accumulators returned through LDS (16 KiB) for the epilogue.
    """

    I_FACTORS = (None, 1, 2, 2)
    J_FACTORS = (1, None, 2, 2)
    K_FACTORS = (None, 2)
    VECTOR = 8  # fp16 lanes per thread of a global -> LDS copy (16 B)

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not has_mfma(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(get_root_block(sch))
        reduction = get_reduction_blocks(sch, blocks)
        if reduction is None:
            return None
        main = reduction[0]
        if get_in_out_dtypes(sch.get(main)) != ("float16", "float32"):
            return None
        if get_index_map(sch.get(main)) is None:
            return None
        try:
            return self._schedule(sch, main)
        except Exception:  # noqa: BLE001  (a GEMM whose form the intrinsics do not match)
            return None

    def _schedule(self, sch: s_tir.Schedule, main) -> s_tir.Schedule | None:
        from tvm.s_tir.tensor_intrin import rocm

        intrin = _intrinsics()
        i_f, j_f, k_f = self.I_FACTORS, self.J_FACTORS, self.K_FACTORS
        num_waves = i_f[2] * j_f[2]

        # normalize to C[S, I, J] += A[S, I, K] * B[S, J, K], then pad to the block tile
        reindex_a = sch.reindex(main, ("read", 0))
        reindex_b = sch.reindex(main, ("read", 1))
        reindex_c = sch.reindex(main, ("write", 0))
        matmul_map, a_map, b_map, c_map = get_index_map(sch.get(main))
        sch.transform_layout(reindex_a, ("write", 0), a_map)
        sch.transform_layout(reindex_b, ("write", 0), b_map)
        sch.transform_layout(reindex_c, ("read", 0), c_map)
        sch.transform_block_layout(main, matmul_map)
        # dlight's threshold for tensor cores on CUDA, so that the A100 and the MI250X
        # put the same GEMMs on matrix cores: a side of 64 or less stays on FMA
        if any(isinstance(v.dom.extent, tirx.IntImm) and v.dom.extent.value <= MIN_EXTENT
               for v in sch.get(main).iter_vars[1:]):
            return None
        sch.pad_einsum(main, [1, 16 * i_f[2] * i_f[3], 16 * j_f[2] * j_f[3], 16 * k_f[1]])

        batch, i, j, k = sch.get_loops(main)
        i, i_inner = sch.split(i, factors=[None, 16])
        j, j_inner = sch.split(j, factors=[None, 16])
        k, k_inner = sch.split(k, factors=[None, 16])
        sch.reorder(i, j, k, i_inner, j_inner, k_inner)
        block_inner = main
        block_outer = sch.blockize(i_inner)

        i0, i1, i2, i3 = sch.split(i, factors=list(i_f))
        j0, j1, j2, j3 = sch.split(j, factors=list(j_f))
        k0, k1 = sch.split(k, factors=list(k_f))
        sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
        sch.bind(batch, "blockIdx.z")
        sch.bind(sch.fuse(i0, j0), "blockIdx.x")
        sch.bind(sch.fuse(i1, j1), "blockIdx.y")
        wave = sch.fuse(j2, i2)
        sch.bind(wave, "threadIdx.y")

        def fetch_to_lds(index):
            stage = sch.cache_read(block_outer, index, "shared")
            sch.compute_at(stage, k0)
            fused = sch.fuse(*sch.get_loops(stage)[-2:])
            _, ty, tx, vec = sch.split(fused, factors=[None, num_waves, WAVE, self.VECTOR])
            sch.bind(tx, "threadIdx.x")
            sch.bind(ty, "threadIdx.y")
            sch.vectorize(vec)
            return stage

        a_lds, b_lds = fetch_to_lds(0), fetch_to_lds(1)
        auto_inline_producers(sch, a_lds)
        auto_inline_producers(sch, b_lds)

        a_frag = sch.cache_read(block_outer, 0, "warp")
        b_frag = sch.cache_read(block_outer, 1, "warp")
        sch.compute_at(a_frag, k1)
        sch.compute_at(b_frag, k1)
        acc_lds = sch.cache_write(block_outer, 0, "shared")
        store = sch.cache_write(block_outer, 0, "warp")
        sch.reverse_compute_at(store, wave)
        sch.reverse_compute_at(acc_lds, wave)
        si, sj = sch.get_loops(store)[-2:]
        si0, si1 = sch.split(si, factors=[None, 16])
        sj0, sj1 = sch.split(sj, factors=[None, 16])
        sch.reorder(si0, sj0, si1, sj1)

        init = sch.decompose_reduction(block_outer, k0)
        init_inner = sch.get_child_blocks(init)[0]

        def fragment_loops(block):
            fi, fj = sch.get_loops(block)[-2:]
            fi0, fi1 = sch.split(fi, factors=[None, 16])
            fj0, fj1 = sch.split(fj, factors=[None, 16])
            sch.reorder(fi0, fj0, fi1, fj1)
            return fi1

        loop_a, loop_b = fragment_loops(a_frag), fragment_loops(b_frag)
        # the fragments' registers in the lane/slot layout the MFMA instruction reads
        sch.transform_layout(a_frag, ("write", 0),
                             _fragment_map(rocm.shared_16x16_to_local_64x4_layout_A))
        sch.transform_layout(b_frag, ("write", 0),  # [N, K] -> the [K, N] layout
                             _fragment_map(lambda n, k:
                                           rocm.shared_16x16_to_local_64x4_layout_B(k, n)))
        sch.transform_layout(store, ("read", 0),
                             _fragment_map(rocm.shared_16x16_to_local_64x4_layout_C))
        sch.tensorize(loop_a, intrin["load_a"])
        sch.tensorize(loop_b, intrin["load_b"])
        sch.tensorize(sch.get_loops(init_inner)[-2], intrin["init"])
        sch.tensorize(sch.get_loops(store)[-2], intrin["store"])
        sch.tensorize(sch.get_loops(block_inner)[-3], intrin["compute"])

        # the epilogue (bias, activation, casts) rides the copy of the accumulators
        auto_inline_consumer_chain(sch, acc_lds)
        fused = sch.fuse(*sch.get_loops(acc_lds)[-2:])
        _, tx, vec = sch.split(fused, factors=[None, WAVE, 4])
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        return sch
