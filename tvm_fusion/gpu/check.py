"""Checks of one scheduled candidate against its GPU target, before it is measured.

:func:`check_schedule` runs the TIR checks (``tir_check``) and, for CUDA, nvcc's
ptxas report against :class:`~tvm_fusion.gpu.limits.GpuLimits` (for gfx90a, the code
object's VGPRs, LDS and scratch);
:func:`resource_check_postproc` puts that check into MetaSchedule's search, so a
rejected candidate never reaches a builder.
"""

from __future__ import annotations

import tvm
from tvm import te
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.postproc import PyPostproc

from ..errors import TvmFusionError
from ..family import CODE_OBJECT, strategy
from .amdgpu import amdgpu_compile, amdgpu_violations, find_toolchain
from .cuda import cuda_source, nvcc_compile
from .limits import GpuLimits, check_kernel
from ..schedules.tir_check import check_launch, device_kernels


def check_schedule(func, hw, *, name: str = "candidate",
                   limits: GpuLimits | None = None) -> list[str]:
    """Check one scheduled PrimFunc against ``hw``'s limits before it is ever measured.

    First the lowered TIR (threads per block, shared memory, vector widths: what would
    make nvcc or the launch fail), then, for CUDA targets, nvcc's ptxas report
    (registers, which TIR cannot show), and for gfx90a the code object's VGPRs, LDS and
    scratch (:func:`~tvm_fusion.gpu.amdgpu.amdgpu_violations`) where the toolchain is
    here. Cheap next to a measurement: one lowering and
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
    target = hw.tvm_target()
    shared_limit = limits.shared_bytes_per_block if limits is not None else None
    limits = limits or GpuLimits.from_target(hw)
    bad = [v for k in device_kernels(func, target, name)
           for v in check_launch(k, hw, shared_limit=shared_limit)]
    compiler = strategy(hw).resource_compiler
    if bad or not compiler:
        return bad
    if compiler == CODE_OBJECT:  # the code object, where the toolchain is here; else TIR only
        found = find_toolchain()
        if found.missing:
            return bad
        entries, _ = amdgpu_compile(func, target, name, found)
        return [v for e in entries for v in amdgpu_violations(e, hw)]
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
    a = te.placeholder((1,), name="a")  # any module: MetaSchedule resolves the rules on one
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((1,), lambda i: a[i])])})
    ctx = ms.TuneContext(mod=mod, target=hw.tvm_target(), space_generator="post-order-apply",
                         search_strategy="replay-trace")
    sg = ctx.space_generator
    return ms.space_generator.PostOrderApply(
        sch_rules=list(sg.sch_rules), mutator_probs=dict(sg.mutator_probs),
        postprocs=[*sg.postprocs,
                   resource_check_postproc(hw, limits=limits, rejected=rejected)])
