"""Whole-model GPU drivers: plan a model, schedule every kernel, check it for the target.

The building blocks (nvcc and ptxas in ``cuda``, limits, TIR checks, default schedules)
know nothing of models or plans; these two functions put them together. For a CUDA
target (``a100`` = sm_80, ``h100``/``h200`` = sm_90):

1. plan the model and apply the plan (one PrimFunc per fused group);
2. give every PrimFunc a GPU schedule: its best tuning record when a database is given,
   else dlight's default rules (Matmul, GEMV, Reduction, GeneralReduction, Fallback; the
   Matmul rule takes the tensor-core path for fp16 GEMMs on sm_70+);
3. generate CUDA C and compile it with nvcc, reading ptxas' report back;
4. check each entry against the target's limits (:mod:`tvm_fusion.gpu.limits`).

A ROCm target's code cannot be built by this TVM: :func:`schedule_and_check` checks its
scheduled TIR instead.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import tvm

from ..family import PTXAS, strategy
from ..graph import build_graph
from ..plan import apply_plan, make_plan
from ..targets import as_target
from .cuda import CudaKernel, GpuToolchainError, cuda_source, nvcc_compile
from .limits import GpuLimits, check_kernel
from ..schedules.default import default_gpu_schedule, schedule_kernels
from ..schedules.tir_check import check_launch, check_scheduled, device_kernels


def build_cuda_kernels(model, target="a100", *, plan=None, database=None,
                       workdir: str | Path | None = None, check: bool = True
                       ) -> tuple[CudaKernel, ...]:
    """Plan, schedule, generate and nvcc-compile every kernel of ``model`` for a CUDA target.

    Parameters
    ----------
    model : ImportedModel
    target : str or HardwareTarget
        A ``cuda``-family target (``a100``, ``h100``, ``h200``).
    plan : FusionPlan, optional
        Default: a fresh cost plan for ``target``.
    database : meta_schedule Database, optional
        Tuning records to apply before the default schedules.
    workdir : path, optional
        Keep every ``.cu`` and ``.cubin`` there.
    check : bool
        Check every kernel against the target's limits, first in TIR (threads, shared
        memory, vector widths: a kernel failing those is not given to nvcc and has no
        entries), then from ptxas' report; violations are recorded on each
        :class:`CudaKernel` (use :func:`~tvm_fusion.gpu.limits.raise_on_violations`).

    Returns
    -------
    tuple of CudaKernel
        One per PrimFunc of the fused module, sorted by name.
    """
    hw = as_target(target)
    if strategy(hw).resource_compiler != PTXAS:  # CUDA C that nvcc compiles
        raise GpuToolchainError(f"build_cuda_kernels needs a cuda-family target, got "
                                f"{hw.name!r} ({hw.family}); CUDA targets: a100, h100, h200")
    tvm_target = hw.tvm_target()
    arch = str(tvm_target.attrs["arch"])
    graph = build_graph(model.mod)
    plan = plan or make_plan(graph, hw)
    mod, origin = schedule_kernels(apply_plan(graph, plan), tvm_target, database=database)
    limits = GpuLimits.from_target(hw)
    out = []
    for gv, func in sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        launches = device_kernels(func, tvm_target, name)
        tir_bad = tuple(v for k in launches for v in check_launch(k, hw))
        src = cuda_source(func, tvm_target, name)
        if tir_bad and check:  # e.g. > 48 KB static shared: nvcc would refuse it anyway
            out.append(CudaKernel(name=name, schedule=origin.get(name, "dlight"), source=src,
                                  entries=(), violations=tir_bad))
            continue
        entries, _ = nvcc_compile(src, arch, workdir=workdir, name=name)
        dyn = {k.name: k.dynamic_shared_bytes for k in launches}
        entries = tuple(replace(e, dynamic_shared_bytes=dyn.get(e.entry, 0)) for e in entries)
        bad = tuple(v for e in entries for v in check_kernel(e, limits)) if check else ()
        out.append(CudaKernel(name=name, schedule=origin.get(name, "dlight"), source=src,
                              entries=entries, violations=bad))
    return tuple(out)


def schedule_and_check(model, target="mi250x", *, plan=None) -> tuple[tvm.IRModule, dict]:
    """Plan ``model`` for a GPU target, give every kernel dlight's default schedule, and
    check the scheduled TIR. No code generator is needed (works for rocm here).

    Returns
    -------
    (tvm.IRModule, dict)
        The scheduled module and :func:`check_scheduled`'s result.
    """
    hw = as_target(target)
    graph = build_graph(model.mod)
    mod = default_gpu_schedule(apply_plan(graph, plan or make_plan(graph, hw)), hw.tvm_target())
    return mod, check_scheduled(mod, hw)
