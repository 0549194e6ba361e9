"""Kernels stage: a model and its tuning logs -> the fused kernels to tune or build."""

from .prepare import KernelOptions, KernelSet, prepare_kernels

__all__ = ["KernelOptions", "KernelSet", "prepare_kernels"]
