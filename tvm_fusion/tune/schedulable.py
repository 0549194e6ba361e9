"""Make a plan tunable: split the groups MetaSchedule's rules cannot schedule.

The planner reasons about cost, not about what the schedule rules can express. Some
fusions it likes (a matmul with a LayerNorm or Softmax epilogue: two reductions where
the second reads the whole row) make MetaSchedule's design-space generation fail in
``reverse-compute-at``. Such a group is split along FuseOps' groups (which MetaSchedule
always handles), or into single ops as a last resort, and the plan says so in its notes.
"""

from __future__ import annotations

from dataclasses import replace

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from ..graph import OpGraph
from ..plan import FusionPlan, apply_plan, describe_plan, plan_from_groups
from ..plan.baseline import fuseops_groups
from .fast_import import import_tensor_intrinsics
from .prepack import mark_layout_free


def unschedulable_groups(fused: tvm.IRModule, plan: FusionPlan, target) -> dict[str, str]:
    """Group name -> error, for the fused groups whose design space cannot be generated.

    Structurally equal kernels (the same layer repeated) are checked once.
    """
    import_tensor_intrinsics()
    seen: dict[int, str | None] = {}
    bad = {}
    for g in plan.groups:
        if len(g.nodes) == 1:
            continue
        func = fused[g.name].with_attr("global_symbol", "main")
        key = tvm_ffi.structural_hash(func)
        if key not in seen:
            ctx = ms.TuneContext(mod=tvm.IRModule({"main": func}), target=target,
                                 space_generator="post-order-apply",
                                 search_strategy="evolutionary", task_name=g.name)
            try:
                ctx.generate_design_space()
                seen[key] = None
            except Exception as e:  # ScheduleError arrives through the FFI as a plain error
                seen[key] = str(e).splitlines()[0][:200]
        if seen[key] is not None:
            bad[g.name] = seen[key]
    return bad


def kernel_module(graph: OpGraph, plan: FusionPlan, *, prepack: bool) -> tvm.IRModule:
    """``plan``'s fused module, its constant weights marked layout-free with ``prepack``.

    What tuning extracts its tasks from and what ``compile`` applies the records to: both
    must mark alike, or no record's workload matches.
    """
    fused = apply_plan(graph, plan)
    return mark_layout_free(fused) if prepack else fused


def make_schedulable(graph: OpGraph, plan: FusionPlan, hw, target: tvm.target.Target, *,
                     prepack: bool = False) -> tuple[FusionPlan, tvm.IRModule, list]:
    """Split ``plan``'s unschedulable groups until every kernel has a design space.

    Returns the (possibly new) plan, its fused module and its extracted tasks; with
    ``prepack`` the kernels' constant weights are layout-free (see :mod:`.prepack`).
    """
    baseline = fuseops_groups(graph)
    for _ in range(3):
        fused = kernel_module(graph, plan, prepack=prepack)
        bad = unschedulable_groups(fused, plan, target)
        if not bad:
            return plan, fused, ms.relax_integration.extract_tasks(fused, target)
        groups, notes = [], list(plan.notes)
        for g in plan.groups:
            if g.name not in bad or len(g.nodes) == 1:
                groups.append(list(g.nodes))
                continue
            members = set(g.nodes)
            pieces = [sorted(members & set(b)) for b in baseline if members & set(b)]
            if len(pieces) == 1:  # FuseOps would fuse it the same way: go to single ops
                pieces = [[n] for n in sorted(members)]
            groups.extend(pieces)
            notes.append(f"{g.name} split into {len(pieces)} kernels: MetaSchedule's "
                         f"rules cannot schedule it ({bad[g.name]})")
        split = plan_from_groups(graph, groups, hw, planner=plan.planner)
        plan = replace(describe_plan(graph, hw, split), notes=tuple(notes), edges=plan.edges,
                       layout=plan.layout, layout_reason=plan.layout_reason,
                       combine=plan.combine)  # the graph keeps its combined matmuls
    fused = kernel_module(graph, plan, prepack=prepack)
    return plan, fused, ms.relax_integration.extract_tasks(fused, target)
