"""The ``cuda`` family: NVIDIA GPUs (kernels built by nvcc, resources read from ptxas)."""

from __future__ import annotations

from .base import CUDA_OCCUPANCY, PTXAS, Family


class CudaFamily(Family):
    """NVIDIA GPUs: IMMA Tensor Cores or DP4A for int8, CUDA's occupancy rules."""

    def int8_unit(self, peaks, features) -> tuple[str, str]:
        if "int8_matrix" in peaks and "int8_tensor" in set(features):
            return "int8_matrix", "IMMA (int8 mma.sync Tensor Cores)"
        if "int8_vector" in peaks:
            return "int8_vector", "DP4A"
        return "", "no int8 peak: priced at the fp32 rate"


FAMILY = CudaFamily(
    name="cuda", tvm_kind="cuda", device_type="cuda", relax_backend="cuda",
    unit_name="SM", shared_memory_name="shared memory", shared_memory_short="smem",
    warp_name="warp",
    is_gpu=True, host_cpu=False, checks_kernel_limits=True,
    fork_join=False, core_caches=False, vector_lanes=False, fitted_efficiency=False,
    prices_transcendentals=False,
    # the 26 kernels of tuning_logs/h200 (benchmarks.planner_accuracy, 1.0685; nearly
    # all launch-bound, and h200.json's launch is fitted to them: an optimistic figure)
    planner_error=1.0685, class_errors=(), shared_compute_cancels=False,
    occupancy_rules=CUDA_OCCUPANCY, mfma=False, reduction_max_threads=1024,
    int8_conv_needs_blocking=False, blocked_layouts=False, reduced_precision=True,
    dlight_default=True, shipped_space_default=False, vector_fma_rules=False,
    vectorize_tensorize_init=False, weight_prepack=False, cost_models_by_isa=False,
    wmma_intrinsics=True, dp4a_int8=True, host_calls=False,
    resource_compiler=PTXAS, device_toolchain=False, own_tir_pipeline=False,
)
