"""A GPU target's per-kernel limits, and the check every generated kernel passes first.

A schedule whose kernel needs more registers or shared memory than the target allows
either fails to launch or (registers) spills to local memory and runs far slower than
the tuner's model expects. :func:`check_kernel` rejects it from ptxas' numbers, before
anything is measured; :func:`resource_check_postproc` does the same for a MetaSchedule candidate
(usable from the tuner's verification path, where a rejected candidate is never built
for measurement).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TvmFusionError

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
        if hw.family == "cpu":
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


def raise_on_violations(kernels) -> None:
    """Raise :class:`ResourceLimitError` listing every violation of ``kernels``.

    Parameters
    ----------
    kernels : iterable of CudaKernel
    """
    bad = [v for k in kernels for v in k.violations]
    if bad:
        raise ResourceLimitError("kernels exceed the target's limits:\n  " + "\n  ".join(bad))


def check_schedule(func, hw, *, name: str = "candidate",
                   limits: GpuLimits | None = None) -> list[str]:
    """Check one scheduled PrimFunc against ``hw``'s limits before it is ever measured.

    First the lowered TIR (threads per block, shared memory, vector widths: what would
    make nvcc or the launch fail), then, for CUDA targets, nvcc's ptxas report
    (registers, which TIR cannot show). Cheap next to a measurement: one lowering and
    one nvcc call, about 0.1-0.3 s.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A scheduled kernel (threads bound).
    hw : HardwareTarget
        A GPU target.
    name : str
        Kernel name in messages.
    limits : GpuLimits, optional
        Override of the target's limits (e.g. a tighter register budget).

    Returns
    -------
    list of str
        One message per violation; empty when the kernel fits.
    """
    from .cuda import cuda_source, nvcc_compile
    from .tir_check import check_launch, device_kernels

    target = hw.tvm_target()
    shared_limit = limits.shared_bytes_per_block if limits is not None else None
    limits = limits or GpuLimits.from_target(hw)
    bad = [v for k in device_kernels(func, target, name)
           for v in check_launch(k, hw, shared_limit=shared_limit)]
    if bad or hw.family != "cuda":
        return bad
    src = cuda_source(func, target, name)
    entries, _ = nvcc_compile(src, str(target.attrs["arch"]), name=name)
    return [v for e in entries for v in check_kernel(e, limits)]


def resource_check_postproc(hw, *, limits: GpuLimits | None = None, rejected=None):
    """A MetaSchedule postprocessor rejecting candidates that exceed ``hw``'s limits.

    Append it to a tune context's postprocs: a candidate it rejects is dropped by the
    search before the builder or runner see it, so it is never measured.

    Parameters
    ----------
    hw : HardwareTarget
        A GPU target.
    limits : GpuLimits, optional
        Override of the target's limits.
    rejected : list, optional
        Receives the violation messages of every rejected candidate.

    Returns
    -------
    tvm.s_tir.meta_schedule.postproc.PyPostproc
    """
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.postproc import PyPostproc

    @derived_object
    class ResourceCheck(PyPostproc):
        def _initialize_with_tune_context(self, context) -> None:
            pass

        def apply(self, sch) -> bool:
            func = sch.mod["main"]
            try:
                bad = check_schedule(func, hw, limits=limits)
            except TvmFusionError as err:  # nvcc rejected the kernel: not measurable
                bad = [str(err)]
            if bad and rejected is not None:
                rejected.append(bad)
            return not bad

        def clone(self):
            return resource_check_postproc(hw, limits=limits, rejected=rejected)

    return ResourceCheck()


def checked_space_generator(hw, *, limits: GpuLimits | None = None, rejected=None):
    """MetaSchedule's design space for ``hw`` plus :func:`resource_check_postproc`.

    The schedule rules, postprocessors and mutators are the ones MetaSchedule picks for
    the target (``post-order-apply``), resolved once, with the limits check appended:
    a candidate over the target's registers, shared memory or threads never reaches a
    builder.

    Returns
    -------
    tvm.s_tir.meta_schedule.space_generator.PostOrderApply
    """
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    a = te.placeholder((1,), name="a")  # any module: MetaSchedule resolves the rules on one
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((1,), lambda i: a[i])])})
    ctx = ms.TuneContext(mod=mod, target=hw.tvm_target(), space_generator="post-order-apply",
                         search_strategy="replay-trace")
    sg = ctx.space_generator
    return ms.space_generator.PostOrderApply(
        sch_rules=list(sg.sch_rules), mutator_probs=dict(sg.mutator_probs),
        postprocs=[*sg.postprocs,
                   resource_check_postproc(hw, limits=limits, rejected=rejected)])
