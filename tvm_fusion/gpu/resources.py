"""The planner's GPU resources checked against the real compilers, and the plan re-made.

The cost model predicts each fused group's registers, shared memory / LDS and threads
from the dlight rule that will schedule it (:mod:`tvm_fusion.plan.gpu_resources`). Here
every group of a plan is scheduled that way and compiled: nvcc (ptxas' report) for
``cuda`` targets, TVM's AMDGPU backend (the code object's metadata) for gfx90a. The
compiler's numbers replace the estimate and the model is planned again, until every
group of the plan has been compiled (a group the new plan fuses differently is built in
the next round)::

    plan, report = plan_with_compiled_resources(graph, "mi250x")
    for row in report.rows:      # predicted against compiled, per fused group
        print(row.name, row.predicted_registers, row.registers, row.blocks_per_unit)

Every group's reason then names the compiler and what it allocated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import tvm

from ..family import CDNA_OCCUPANCY, CODE_OBJECT, PTXAS, strategy
from ..plan import AnalyticalCostModel, apply_plan, make_plan
from ..plan.cost_planner import describe_groups
from ..plan.gpu_resources import GpuResources
from ..plan.options import RESOURCE_MODES
from ..plan.gpu_terms import waves_per_simd
from ..targets import as_target
from .amdgpu import amdgpu_compile, find_toolchain, toolchain
from .cuda import GpuToolchainError, cuda_source, find_nvcc, nvcc_compile
from ..schedules.default import default_gpu_schedule
from ..schedules.tir_check import device_kernels


@dataclass(frozen=True, kw_only=True)
class ResourceRow:
    """One fused group: what the planner assumed against what the compiler allocated."""

    name: str
    ops: int
    schedule: str
    kernels: int
    predicted_registers: int
    registers: int
    predicted_shared_bytes: int
    shared_bytes: int
    spill_bytes: int
    threads_per_block: int
    predicted_blocks_per_unit: int
    blocks_per_unit: int
    occupancy: float
    waves_per_simd: int = 0  # gfx90a: by the VGPRs alone (CDNA2's rule, gpu_terms)


@dataclass(frozen=True, kw_only=True)
class ResourceReport:
    """What :func:`plan_with_compiled_resources` did."""

    target: str
    source: str
    rounds: int
    rows: tuple[ResourceRow, ...]
    changed: tuple[str, ...]  # groups of the estimate-only plan the compiled plan changed
    failed: tuple[str, ...] = ()  # groups the compiler refused (their estimate stays)
    compiled: dict = field(default_factory=dict)  # frozenset of nodes -> GpuResources

    def summary(self) -> str:
        """The predicted-against-compiled table, one line per group."""
        amd = self.source.startswith("gfx")
        regs, where = ("VGPRs", "CU") if amd else ("regs", "SM")
        lines = [f"kernel resources from the {self.source} ({self.rounds} round(s); "
                 f"estimate -> compiled):",
                 f"  {'group':44s} {regs:>9s} {'shared B':>13s} {'spill':>5s} "
                 f"{'blocks/' + where:>10s}" + ("  waves/SIMD" if amd else "")]
        for r in self.rows:
            lines.append(
                f"  {r.name[:44]:44s} {r.predicted_registers:>4d}->{r.registers:<4d} "
                f"{r.predicted_shared_bytes:>6d}->{r.shared_bytes:<6d} {r.spill_bytes:>5d} "
                f"{r.predicted_blocks_per_unit:>4d}->{r.blocks_per_unit:<5d}"
                + (f"  {r.waves_per_simd:>10d}" if amd else ""))
        if self.changed:
            lines.append(f"  the compiled numbers changed the plan: {', '.join(self.changed)}")
        for f in self.failed:
            lines.append(f"  not compiled: {f}")
        return "\n".join(lines)


def compiler_source(hw) -> str:
    """``"ptxas sm_80"`` / ``"gfx90a code object"``: the compiler for ``hw``'s kernels."""
    cfg = hw.tvm_config
    if strategy(hw).resource_compiler == PTXAS:
        return f"ptxas {cfg.get('arch', 'sm_80')}"
    return f"{cfg.get('mcpu', 'gfx90a')} code object"


def require_compiler(hw) -> None:
    """Raise :class:`GpuToolchainError` unless ``hw``'s kernels can be compiled here."""
    compiler = strategy(hw).resource_compiler
    if compiler == PTXAS and find_nvcc() is None:
        raise GpuToolchainError("reading registers from the compiler needs nvcc (the CUDA "
                                "toolkit: $TVM_FUSION_NVCC, nvcc on PATH or /usr/local/cuda)")
    if compiler == CODE_OBJECT:
        missing = find_toolchain().missing
        if missing:
            raise GpuToolchainError("reading registers from gfx90a code objects needs "
                                    + "; ".join(missing)
                                    + ": `apt-get install rocm-device-libs lld-19`")
    if not compiler:
        raise GpuToolchainError(f"target {hw.name!r} is a {hw.family}: compiled kernel "
                                "resources are read for cuda and rocm targets only")


# dlight's rule -> the schedule class of plan.gpu_resources
RULE_SCHEDULE = {"Matmul": "gemm", "RocmMfmaMatmul": "gemm", "PackedInt8Dp4a": "gemm",
                 "GEMV": "reduction",
                 "Reduction": "reduction", "GeneralReduction": "reduction",
                 "Fallback": "elementwise"}


def compile_group(func: tvm.tirx.PrimFunc, hw, name: str, rule: str = "") -> GpuResources:
    """Compile one scheduled PrimFunc for ``hw`` and summarize its kernels: the most
    registers, shared memory and threads over them, their spills (bytes per thread).
    ``rule``: the dlight rule that scheduled it; its schedule class is kept (a GEMM
    group that only dlight's Fallback rule could schedule is ``elementwise``)."""
    target = hw.tvm_target()
    launches = device_kernels(func, target, name)
    threads = max((k.threads_per_block for k in launches), default=1)
    dyn = max((k.dynamic_shared_bytes for k in launches), default=0)
    if strategy(hw).resource_compiler == PTXAS:
        asm = cuda_source(func, target, name)
        entries, _ = nvcc_compile(asm, str(target.attrs["arch"]), name=name)
        regs = max((e.registers for e in entries), default=0)
        shared = max((e.shared_bytes for e in entries), default=0) + dyn
        spill = max((e.spill_stores for e in entries), default=0)
    else:
        entries, asm = amdgpu_compile(func, target, name)
        regs = max((e.unified_vgprs for e in entries), default=0)
        shared = max((e.lds_bytes for e in entries), default=0)
        spill = max((e.scratch_bytes for e in entries), default=0)
    schedule = RULE_SCHEDULE.get(rule, "compiled")
    if len(entries) > 1:
        schedule = "split"
    elif schedule == "gemm" and "wmma" in asm:
        schedule = "gemm-tensorcore"
    elif schedule == "gemm" and "v_mfma" in asm:
        schedule = "gemm-mfma"
    return GpuResources(schedule=schedule, kernels=max(len(entries), 1),
                        threads_per_block=threads, registers_per_thread=regs,
                        shared_bytes=shared, spill_bytes=spill, source=compiler_source(hw))


def compiled_resources(graph, plan, hw, *, only=None
                       ) -> tuple[dict[frozenset, GpuResources], list[str]]:
    """Compile the groups of ``plan`` (``only``: those groups) under dlight's default
    schedules, as an untuned deployment runs them.

    Returns
    -------
    (dict, list of str)
        frozenset of node ids -> the compiled :class:`GpuResources`; and the groups the
        compiler refused, each with why (their estimate stays).
    """
    hw = as_target(hw)
    require_compiler(hw)
    wanted = {g.name: frozenset(g.nodes) for g in (only or plan.groups)}
    rules: dict[str, str] = {}
    mod = default_gpu_schedule(apply_plan(graph, plan), hw.tvm_target(), hw, rules_used=rules)
    funcs = {gv.name_hint: f for gv, f in mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    # a group identical to an earlier one (same ops, shapes and constants) shares its
    # PrimFunc, which Relax's BlockBuilder keeps under the first group's name
    twin = {n: re.sub(r"_\d+$", "", n) for n in wanted if n not in funcs}
    names = dict.fromkeys([n for n in wanted if n in funcs]
                          + [b for b in twin.values() if b in funcs])
    jobs = [(n, funcs[n]) for n in names]

    def build(job):
        name, func = job
        try:
            return name, compile_group(func, hw, name, rules.get(name, "")), None
        except GpuToolchainError as err:
            return name, None, f"{name}: {str(err).splitlines()[0]}"
        except Exception as err:  # noqa: BLE001  (TVM cannot lower it: the build says why)
            lines = str(err).strip().splitlines()
            return name, None, f"{name}: TVM cannot lower it ({lines[-1] if lines else err})"

    # the compilers are separate processes (nvcc) or release the GIL (LLVM)
    with toolchain() if strategy(hw).device_toolchain else contextlib.nullcontext(), \
            ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 1)) as pool:
        done = list(pool.map(build, jobs))
    built = {name: res for name, res, _ in done if res is not None}
    built.update({n: built[base] for n, base in twin.items() if base in built})
    out = {wanted[name]: res for name, res in built.items() if name in wanted}
    return out, [why for _, _, why in done if why]


def plan_with_compiled_resources(graph, target, *, planner: str = "cost", rounds: int = 8,
                                 group_model=None, start=None):
    """Plan ``graph`` for a GPU target with the compiler's registers and shared memory.

    Plan with the estimates, compile the plan's groups, plan again with what the
    compiler allocated; repeat while the new plan has groups not yet compiled (at most
    ``rounds`` compilations). ``start``: the estimate-only plan of ``graph`` when the
    caller has one (:func:`~tvm_fusion.plan.plan_model`'s); its layout and combined
    matmuls are kept.

    Returns
    -------
    (FusionPlan, ResourceReport)
        The plan (its groups' reasons name the compiler; a note says how many of its
        kernels were compiled), and the predicted-against-compiled table.

    Raises
    ------
    GpuToolchainError
        No compiler for ``target`` here (the message says what to install).
    """
    hw = as_target(target)
    require_compiler(hw)
    first = plan = start or make_plan(graph, hw, planner, group_model=group_model)
    compiled: dict[frozenset, GpuResources] = {}
    failed: list[str] = []
    seen = [first]
    done = 0
    while True:
        todo = [g for g in plan.groups if frozenset(g.nodes) not in compiled
                and not any(f.startswith(g.name + ":") for f in failed)]
        if not todo:
            break
        more, bad = compiled_resources(graph, plan, hw, only=todo)
        compiled.update(more)
        failed += bad
        done += 1
        if done >= rounds:  # the last plan's kernels are compiled, not planned again
            break
        plan = make_plan(graph, hw, planner, group_model=group_model, compiled=compiled)
        seen.append(plan)
    # of the plans made, the fastest by the compiler's numbers among those whose every
    # kernel was compiled (a plan made before a group was found to split stays in)
    model = AnalyticalCostModel(graph, hw, compiled=compiled)
    whole = [p for p in seen if all(frozenset(g.nodes) in compiled for g in p.groups)]
    late = not any(p is plan for p in whole)
    plan = min(whole or [plan], key=lambda p: sum(model.group_cost(g.nodes).total_us
                                                  for g in p.groups))
    plan = describe_groups(graph, hw, plan, cost_model=model)
    before = {frozenset(g.nodes) for g in first.groups}
    changed = tuple(g.name for g in first.groups
                    if frozenset(g.nodes) not in {frozenset(h.nodes) for h in plan.groups})
    rows = resource_rows(graph, plan, hw, compiled)
    have = sum(frozenset(g.nodes) in compiled for g in plan.groups)
    note = (f"kernel resources: {have} of {len(plan.groups)} kernels compiled "
            f"({compiler_source(hw)}, dlight's default schedules, {done} round(s)); the "
            f"compiler's registers and shared memory replace the estimates")
    if changed:
        note += (f"; with them the plan changed {len(changed)} of the estimate-only plan's "
                 f"{len(before)} groups ({', '.join(changed[:4])}"
                 + (", ..." if len(changed) > 4 else "") + ")")
    if late:
        note += (f"; the plan still changed after {rounds} rounds: the fastest of the "
                 f"{len(whole)} fully compiled plans is kept")
    if failed:
        note += f"; not compiled (estimate kept): {'; '.join(failed[:3])}"
    by_name = {r.name: r for r in rows}
    keep = ("schedule", "registers", "predicted_registers", "shared_bytes", "spill_bytes",
            "threads_per_block", "kernels", "blocks_per_unit", "occupancy", "waves_per_simd")
    groups = tuple(dataclasses.replace(g, resources={
        "source": compiler_source(hw), **{k: getattr(by_name[g.name], k) for k in keep}})
        if frozenset(g.nodes) in compiled else g for g in plan.groups)
    plan = dataclasses.replace(plan, groups=groups, notes=plan.notes + (note,),
                               layout=first.layout,
                               layout_reason=first.layout_reason, combine=first.combine)
    return plan, ResourceReport(target=hw.name, source=compiler_source(hw), rounds=done,
                                rows=rows, changed=changed, failed=tuple(failed),
                                compiled=compiled)


def resource_rows(graph, plan, hw, compiled) -> tuple[ResourceRow, ...]:
    """Per group of ``plan``: the estimate's registers, shared memory and blocks per unit
    against the compiled ones (the estimate's where the group was not compiled)."""
    est_model = AnalyticalCostModel(graph, hw)
    built_model = AnalyticalCostModel(graph, hw, compiled=compiled)
    rows = []
    for g in plan.groups:
        est, built = est_model.group_cost(g.nodes), built_model.group_cost(g.nodes)
        e, b = est.resources, built.resources
        rows.append(ResourceRow(
            name=g.name, ops=len(g.nodes), schedule=e.schedule, kernels=b.kernels,
            predicted_registers=e.registers_per_thread, registers=b.registers_per_thread,
            predicted_shared_bytes=e.shared_bytes, shared_bytes=b.shared_bytes,
            spill_bytes=b.spill_bytes, threads_per_block=b.threads_per_block,
            predicted_blocks_per_unit=est.blocks_per_unit,
            blocks_per_unit=built.blocks_per_unit, occupancy=built.occupancy,
            waves_per_simd=waves_per_simd(b)
            if strategy(hw).occupancy_rules == CDNA_OCCUPANCY else 0))
    return tuple(rows)


def plan_resources(graph, hw, plan, *, mode: str = "auto", planner: str = "cost",
                   group_model=None):
    """``plan`` re-made with compiled kernel resources as ``mode`` says.

    ``auto``: on a GPU target whose compiler is here (nvcc; the gfx90a toolchain), else
    the estimates, with a note saying why. ``compiled``: the compiler's, or
    :class:`GpuToolchainError` naming what to install. ``estimated``: ``plan`` as it is.
    CPU targets: ``plan`` as it is.

    Returns
    -------
    (FusionPlan, ResourceReport or None)
    """
    if mode not in RESOURCE_MODES:
        raise GpuToolchainError(f"unknown resources mode {mode!r}; expected one of "
                                f"{', '.join(RESOURCE_MODES)}")
    hw = as_target(hw)
    if not strategy(hw).resource_compiler or mode == "estimated":
        return plan, None
    if mode == "auto":
        try:
            require_compiler(hw)
        except GpuToolchainError as err:
            note = f"kernel resources: estimated, not compiled ({err})"
            return dataclasses.replace(plan, notes=plan.notes + (note,)), None
    return plan_with_compiled_resources(graph, hw, planner=planner, group_model=group_model,
                                        start=plan)
