"""GPU targets: CUDA kernels built and resource-checked with nvcc, ROCm schedules checked in TIR."""

from .cuda import (CudaKernel, GpuToolchainError, KernelResources, build_cuda_kernels,
                   cuda_source, default_gpu_schedule, find_nvcc, nvcc_compile,
                   parse_ptxas_report, sass)
from .limits import (GpuLimits, ResourceLimitError, check_kernel, check_schedule,
                     resource_check_postproc)

__all__ = ["CudaKernel", "GpuLimits", "GpuToolchainError", "KernelResources",
           "ResourceLimitError", "build_cuda_kernels", "check_kernel", "check_schedule",
           "cuda_source", "default_gpu_schedule", "find_nvcc", "nvcc_compile",
           "parse_ptxas_report", "resource_check_postproc", "sass"]
