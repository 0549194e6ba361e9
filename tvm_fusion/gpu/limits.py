"""A GPU target's per-kernel limits, and the check every generated kernel passes first.

A schedule whose kernel needs more registers or shared memory than the target allows
either fails to launch or (registers) spills to local memory and runs far slower than
the tuner's model expects. :func:`check_kernel` rejects it from ptxas' numbers, before
anything is measured; ``gpu/check.py`` applies it (and the TIR checks) to a MetaSchedule candidate before
it is measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import TvmFusionError
from ..family import strategy

# PTX ISA / CUDA Programming Guide, compute capability 3.5 to 9.0: at most 255 registers
# per thread (ptxas' maxrregcount ceiling).
MAX_REGISTERS_PER_THREAD = 255


class ResourceLimitError(TvmFusionError):
    """A kernel needs more registers, shared memory or threads than its target allows."""


@dataclass(frozen=True, kw_only=True)
class GpuLimits:
    """Per-kernel limits of one GPU target.

    Attributes
    ----------
    target : str
    registers_per_thread : int
        255 on every NVIDIA architecture since sm_35.
    registers_per_block : int
        The SM's register file (TVM's ``registers_per_block``, else the hw file's
        ``registers_per_unit``).
    shared_bytes_per_block : int
        Static shared memory per block (``__shared__`` arrays: 48 KB on every NVIDIA
        GPU; the target's ``max_shared_memory_per_block``).
    max_shared_bytes_per_block : int
        Static plus dynamic shared memory per block, with the opt-in TVM's CUDA runtime
        makes for dynamic shared memory above 48 KB (A100 163 KB, H100 227 KB).
    threads_per_block : int
    """

    target: str
    registers_per_thread: int
    registers_per_block: int
    shared_bytes_per_block: int
    max_shared_bytes_per_block: int
    threads_per_block: int

    @classmethod
    def from_target(cls, hw) -> "GpuLimits":
        """The limits of a GPU :class:`~tvm_fusion.targets.HardwareTarget`."""
        if not strategy(hw).is_gpu:
            raise ResourceLimitError(f"target {hw.name!r} is a CPU: GPU kernel limits apply "
                                     "to cuda and rocm targets only")
        cfg = hw.tvm_config
        return cls(target=hw.name,
                   registers_per_thread=MAX_REGISTERS_PER_THREAD,
                   registers_per_block=int(cfg.get("registers_per_block",
                                                   hw.registers_per_unit)),
                   shared_bytes_per_block=hw.usable_shared_memory_per_block,
                   max_shared_bytes_per_block=hw.shared_memory_bytes_per_block,
                   threads_per_block=int(cfg.get("max_threads_per_block",
                                                 hw.max_threads_per_block)))


def check_kernel(res, limits: GpuLimits) -> list[str]:
    """Violations of ``limits`` by one kernel entry (a :class:`KernelResources`); [] if none.

    Each message names the kernel, the resource, what it uses, the limit, and what to do.
    """
    bad = []
    where = f"kernel {res.entry} ({res.arch}) on {limits.target}"
    if res.registers > limits.registers_per_thread:
        bad.append(f"{where}: {res.registers} registers per thread, limit "
                   f"{limits.registers_per_thread}; use a smaller per-thread tile")
    if res.threads_per_block and res.registers_per_block > limits.registers_per_block:
        bad.append(f"{where}: {res.registers} registers x {res.threads_per_block} threads "
                   f"= {res.registers_per_block} registers per block, limit "
                   f"{limits.registers_per_block} (the SM's register file); use fewer "
                   f"threads per block or a smaller per-thread tile")
    if res.shared_bytes > limits.shared_bytes_per_block:
        bad.append(f"{where}: {res.shared_bytes} bytes of static shared memory per block, "
                   f"limit {limits.shared_bytes_per_block}; use smaller shared-memory tiles "
                   f"(or dynamic shared memory)")
    dyn = getattr(res, "dynamic_shared_bytes", 0)
    if dyn and res.shared_bytes + dyn > limits.max_shared_bytes_per_block:
        bad.append(f"{where}: {res.shared_bytes} static + {dyn} dynamic bytes of shared "
                   f"memory per block, limit {limits.max_shared_bytes_per_block}; use "
                   f"smaller shared-memory tiles or fewer pipeline stages")
    if res.threads_per_block > limits.threads_per_block:
        bad.append(f"{where}: {res.threads_per_block} threads per block, limit "
                   f"{limits.threads_per_block}")
    return bad


def raise_on_violations(found) -> None:
    """Raise :class:`ResourceLimitError` listing every violation in ``found``.

    Parameters
    ----------
    found : mapping or iterable of CudaKernel
        Kernel name -> violation messages (what
        :func:`~tvm_fusion.schedules.tir_check.check_scheduled` returns), or the kernels of
        :func:`~tvm_fusion.gpu.build_cuda_kernels` (each with its ``violations``).
    """
    pairs = found.items() if isinstance(found, Mapping) else ((k.name, k.violations)
                                                                for k in found)
    bad = [v for _, violations in pairs for v in violations]
    if bad:
        raise ResourceLimitError("kernels exceed the target's limits:\n  " + "\n  ".join(bad))
