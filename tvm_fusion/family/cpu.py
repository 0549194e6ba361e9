"""The ``cpu`` family: LLVM targets, kernels on the host's cores."""

from __future__ import annotations

from .base import PLAIN_OCCUPANCY, Family


class CpuFamily(Family):
    """CPUs: VNNI / AMX for int8, the fitted efficiency shares, the CPU rules."""

    def int8_unit(self, peaks, features) -> tuple[str, str]:
        feats = set(features)
        if "amx_int8" in feats and "int8_matrix" in peaks:
            return "int8_matrix", "AMX-INT8 (tdpbusd)"
        if feats & {"avx512_vnni", "avx_vnni"} and "int8_vector" in peaks:
            width = "zmm" if "avx512_vnni" in feats else "ymm"
            return "int8_vector", f"VNNI (vpdpbusd {width})"
        return "", "no VNNI: vpmaddubsw + vpmaddwd at the fp32 rate"


FAMILY = CpuFamily(
    name="cpu", tvm_kind="llvm", device_type="cpu", relax_backend="cpu_generic",
    unit_name="cores", shared_memory_name="shared memory", shared_memory_short="smem",
    warp_name="warp",
    is_gpu=False, host_cpu=True, checks_kernel_limits=False,
    fork_join=True, core_caches=True, vector_lanes=True, fitted_efficiency=True,
    prices_transcendentals=True,
    # held out model by model on the 377 tuned kernels of 15 models of the corpus on the
    # Zen 4, each priced with the shares fitted on the other 14 (benchmarks/RESULTS.md
    # run 24, `python -m benchmarks planner --loo`): the median over all kernels and the
    # median per op class. Was 2.12, measured on five models before the bandwidth shares.
    planner_error=1.26,
    class_errors=(("gemm", 1.37), ("conv", 1.12), ("depthwise", 1.35),
                  ("reduction", 1.51), ("elementwise/memory", 1.34),
                  ("gather/scatter", 1.51)),
    shared_compute_cancels=True,
    occupancy_rules=PLAIN_OCCUPANCY, mfma=False, reduction_max_threads=256,
    int8_conv_needs_blocking=True, blocked_layouts=True, reduced_precision=False,
    dlight_default=False, shipped_space_default=True, vector_fma_rules=True,
    vectorize_tensorize_init=True, weight_prepack=True, cost_models_by_isa=True,
    wmma_intrinsics=False, dp4a_int8=False, host_calls=True,
    resource_compiler="", device_toolchain=False, own_tir_pipeline=False,
)
