"""The ``rocm`` family: AMD GPUs (gfx90a code objects linked with the toolchain found here)."""

from __future__ import annotations

from .base import CDNA_OCCUPANCY, CODE_OBJECT, Family


class RocmFamily(Family):
    """AMD GPUs: dot4 for int8, MFMA matrix cores, CDNA's occupancy rules."""

    def int8_unit(self, peaks, features) -> tuple[str, str]:
        if "int8_vector" in peaks:
            return "int8_vector", "dot4 (v_dot4_i32_i8)"
        return "", "no int8 peak: priced at the fp32 rate"


FAMILY = RocmFamily(
    name="rocm", tvm_kind="rocm", device_type="rocm", relax_backend="rocm",
    unit_name="CU", shared_memory_name="LDS", shared_memory_short="LDS",
    warp_name="wavefront",
    is_gpu=True, host_cpu=False, checks_kernel_limits=True,
    fork_join=False, core_caches=False, vector_lanes=False, fitted_efficiency=False,
    prices_transcendentals=False,
    # no MI250X was measured: the figure of the CUDA kernels (family/cuda.py)
    planner_error=1.0685, class_errors=(), shared_compute_cancels=False,
    occupancy_rules=CDNA_OCCUPANCY, mfma=True, reduction_max_threads=256,
    int8_conv_needs_blocking=False, blocked_layouts=False, reduced_precision=True,
    dlight_default=True, shipped_space_default=False, vector_fma_rules=False,
    vectorize_tensorize_init=False, weight_prepack=False, cost_models_by_isa=False,
    wmma_intrinsics=False, dp4a_int8=False, host_calls=False,
    resource_compiler=CODE_OBJECT, device_toolchain=True, own_tir_pipeline=True,
)
