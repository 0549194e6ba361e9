"""GPU targets: CUDA kernels built and resource-checked with nvcc, ROCm schedules checked in TIR.

No GPU is needed for any of it::

    from tvm_fusion.gpu import build_cuda_kernels, raise_on_violations
    kernels = build_cuda_kernels(model, "a100")      # plan, dlight schedules, nvcc -Xptxas -v
    for k in kernels:
        print(k.name, k.registers, k.shared_bytes)   # per thread / per block, from ptxas
    # MI250X: this TVM cannot build ROCm code; the scheduled TIR is checked instead
    from tvm_fusion.gpu import schedule_and_check
    mod, violations = schedule_and_check(model, "mi250x")

``check_schedule`` / ``resource_check_postproc`` reject an over-limit schedule before it
is measured; ``precision.apply_precision(model, "fp16")`` is ``--precision fp16``;
``sample.predict_best`` picks a schedule by a cost model's prediction alone.
"""

from .check import check_schedule, resource_check_postproc
from .cuda import (CudaKernel, GpuToolchainError, KernelResources, cuda_source, find_nvcc,
                   nvcc_compile, parse_ptxas_report, sass)
from .limits import GpuLimits, ResourceLimitError, check_kernel, raise_on_violations
from .pipeline import build_cuda_kernels, schedule_and_check
from ..schedules.default import default_gpu_schedule, default_schedule

__all__ = ["CudaKernel", "GpuLimits", "GpuToolchainError", "KernelResources",
           "ResourceLimitError", "build_cuda_kernels", "check_kernel", "check_schedule",
           "cuda_source", "default_gpu_schedule", "default_schedule", "find_nvcc",
           "nvcc_compile", "parse_ptxas_report", "raise_on_violations",
           "resource_check_postproc", "sass", "schedule_and_check"]
