"""Parallel matmuls (Q/K/V) combined where the planner's cost says it pays.

Combining ``n`` matmuls that read one input into one wide matmul and a split
(:mod:`tvm_fusion.simplify.parallel`) saves ``n - 1`` kernel calls and reads the input
once, but the wide kernel's tiles and the split's readers differ from the narrow ones,
so whether it pays depends on the target. The graph stage sits below the planner, so the
decision is made here, from one more plan: of the graph with every group combined (in
the layout already chosen). The kernels that plan and the plan of the separate graph do
not share are the *affected* kernels; each is a group's when it holds that group's
matmuls, bias adds or split, or (its nodes unchanged, its boundaries moved) borders only
that group's kernels. A group whose kernels cannot be told apart from another's (one
kernel holds both) is priced from a plan where only it is combined, as every group was
before: that cost one planning pass per group (plcmos, 38 GRU groups: minutes). A
group is thus priced with the others combined too; where a kernel joins one group's
nodes to nodes next to another group, the kernels priced can differ from those of a plan
where only it is combined (plcmos' last GRU steps: 2 kernels, 1.58 us each side, where
the plan of that group alone differs in 3, 2.46 us; the same saving to 0.0002 us). The
combine is made when a group's affected kernels' predicted time drops by more than the
planner's tie margin (``TIE_FRACTION`` of the separate time plus ``TIE_FLOOR_US``, as
for a merge).

Each decision, made or not, is a :class:`~tvm_fusion.plan.fusion_plan.CombinedMatmuls`
in ``FusionPlan.combine`` with both predicted times, so ``plan`` prints it, ``--explain
combine`` explains it, and :func:`graph_for_plan` rebuilds the graph the plan was made
for (``compile``, ``jit``, ``tune`` against stored plans). A plan without the field
combines nothing, as before.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import tvm

from ..errors import PlanError
from ..graph import OpGraph
from ..graph.op_graph import call_tir_bindings
from ..simplify.parallel import (ParallelMatmuls, combine_matmuls, parallel_matmuls,
                                 traced_combine)
from .cost_planner import TIE_FLOOR_US, TIE_FRACTION
from .fusion_plan import CombinedMatmuls, FusionPlan
from .layout import graph_in_layout
from .op_info import node_name
from .options import COMBINE_MODES



def _group_key(graph: OpGraph, group) -> tuple:
    """What makes two plans' kernels the same kernel: its nodes' kinds, shapes, work and
    predicted time (op and node names shift when another part of the graph changes)."""
    nodes = tuple((n.kind, n.shape, n.dtype, n.flops, n.bytes_read, n.bytes_written)
                  for n in (graph.nodes[i] for i in group.nodes))
    return nodes, round(group.est_us, 4)


def _affected(graph_a, plan_a, graph_b, plan_b) -> tuple[list, list]:
    """Kernels of plan ``a`` that ``b`` has not, and of ``b`` that ``a`` has not."""
    keys_a = [_group_key(graph_a, g) for g in plan_a.groups]
    keys_b = [_group_key(graph_b, g) for g in plan_b.groups]
    left = Counter(keys_a) - Counter(keys_b)
    right = Counter(keys_b) - Counter(keys_a)
    only_a, only_b = [], []
    for keys, plan, rest, out in ((keys_a, plan_a, left, only_a), (keys_b, plan_b, right, only_b)):
        for k, g in zip(keys, plan.groups):
            if rest[k] > 0:
                rest[k] -= 1
                out.append(g)
    return only_a, only_b


def _stable_names(graph: OpGraph, group: ParallelMatmuls) -> tuple[str, ...]:
    """The matmuls' ``<op>#<id>`` names in ``graph`` (their Relax names if not found)."""
    by_var: dict[str, str] = {}
    for node, b in zip(graph.nodes, call_tir_bindings(graph.mod)):
        by_var.setdefault(b.var.name, node_name(node))
    return tuple(by_var.get(n, n) for n in group.names)


def _margin(us: float) -> float:
    # The whole time, compute included, unlike a CPU merge's margin
    # (CostPlanner.shared_us): a merge keeps its GEMM as it is, so the compute share's
    # error cancels between the two sides; combining changes the GEMM's shape (N three
    # times wider), whose achieved share is what the model knows least.
    return TIE_FRACTION * us + TIE_FLOOR_US


def _decide(group, ops, only_sep, only_comb, mode: str) -> CombinedMatmuls:
    sep_us = sum(g.est_us for g in only_sep)
    comb_us = sum(g.est_us for g in only_comb)
    saving, margin = sep_us - comb_us, _margin(sep_us)
    pays = saving > margin
    what = (f"{len(only_sep)} kernels {sep_us:.2f} us apart vs {len(only_comb)} "
            f"{comb_us:.2f} us combined")
    if mode == "on":
        reason = f"forced (combine on); {what}"
    elif pays:
        reason = f"saves {saving:.2f} us, more than the model's error (+-{margin:.2f} us): {what}"
    else:
        reason = (f"saves {saving:.2f} us, not more than the model's error "
                  f"(+-{margin:.2f} us): {what}")
    return CombinedMatmuls(index=group.index, names=group.names, ops=ops,
                           combined=pays or mode == "on", separate_us=sep_us,
                           combined_us=comb_us, separate_kernels=len(only_sep),
                           combined_kernels=len(only_comb), reason=reason)


def _owners(graph: OpGraph, names: dict[int, tuple[str, ...]]) -> dict[int, int]:
    """Node id -> index of the group whose Relax variable (``names[index]``) it binds."""
    group_of = {n: i for i, ns in names.items() for n in ns}
    return {node.id: group_of[b.var.name]
            for node, b in zip(graph.nodes, call_tir_bindings(graph.mod))
            if b.var.name in group_of}


def _attribute(graph: OpGraph, kernels: list, owner: dict[int, int]
               ) -> tuple[dict[int, list], set[int] | None]:
    """Split the kernels one plan has and the other has not among the groups.

    A kernel holding nodes of one group is that group's. A kernel holding none of them
    (its nodes are unchanged but their kernel boundaries moved) is the group's whose
    kernels its connected run of such kernels touches. Returns the kernels per group
    and the groups that cannot be told apart (a kernel touching several groups), or
    None when some kernel touches no group at all.
    """
    where = {n: i for i, k in enumerate(kernels) for n in k.nodes}
    users = graph.consumers()
    near: list[set[int]] = [set() for _ in kernels]
    for i, k in enumerate(kernels):
        for n in k.nodes:
            for m in (*graph.nodes[n].inputs, *users[n]):
                j = where.get(m, i)
                if j != i:
                    near[i].add(j)
                    near[j].add(i)
    own = [{owner[n] for n in k.nodes if n in owner} for k in kernels]
    seen: set[int] = set()
    for i in range(len(kernels)):
        if own[i] or i in seen:
            continue
        run, todo = [], [i]
        seen.add(i)
        while todo:
            x = todo.pop()
            run.append(x)
            for y in near[x] - seen:
                if not own[y]:
                    seen.add(y)
                    todo.append(y)
        touched = {o for x in run for y in near[x] for o in own[y]}
        if not touched:
            return {}, None
        for x in run:
            own[x] = touched
    by_group: dict[int, list] = {}
    tangled: set[int] = set()
    for k, groups in zip(kernels, own):
        if len(groups) > 1:
            tangled |= groups
        by_group.setdefault(min(groups), []).append(k)
    return by_group, tangled


def choose_combine(mod: tvm.IRModule, hw, make_plan, graph: OpGraph, plan: FusionPlan, *,
                   combine: str = "auto", say=None) -> tuple[OpGraph, FusionPlan]:
    """Decide, for each group of parallel matmuls of ``mod``, whether to combine it.

    Every group is priced from one more plan, of the graph with all groups combined:
    the kernels that plan and ``plan`` do not share are split among the groups (a
    kernel is a group's when it holds that group's matmuls, bias adds or split, or
    borders only that group's kernels). A group whose kernels cannot be told apart from
    another's is priced alone, with a plan of the graph where only it is combined. The
    graph with the chosen groups is planned once more unless that plan is one of these.

    Parameters
    ----------
    mod : tvm.IRModule
        The (simplified) module ``graph`` was built from.
    hw : HardwareTarget
    make_plan : callable
        ``make_plan(graph, hw) -> FusionPlan``, the planner.
    graph, plan :
        The separate graph (in its chosen layout) and its plan.
    combine : str
        One of :data:`COMBINE_MODES`.
    say : callable, optional
        Told each planning pass as it begins (``say("Q/K/V: planning ...")``).

    Returns
    -------
    (OpGraph, FusionPlan)
        The graph with the chosen groups combined and its plan; ``plan.combine`` holds
        every group's decision with both predicted times.
    """
    if combine not in COMBINE_MODES:
        raise PlanError(f"unknown combine mode {combine!r}; expected one of "
                        f"{', '.join(COMBINE_MODES)}")
    groups = parallel_matmuls(mod)
    if not groups or combine == "off":
        return graph, plan
    keep = {"layout": plan.layout, "layout_reason": plan.layout_reason}
    say = say or (lambda stage: None)

    def planned(only, what):
        say(f"Q/K/V: planning the graph with {what}")
        new_mod, combiner = traced_combine(mod, only)
        new_graph = graph_in_layout(new_mod, plan.layout)
        return new_graph, make_plan(new_graph, hw), combiner

    every = frozenset(g.index for g in groups)
    trials = {every: planned(every, f"all {len(every)} groups of parallel matmuls combined")}
    all_graph, all_plan, combiner = trials[every]
    only_sep, only_comb = _affected(graph, plan, all_graph, all_plan)
    sep, tangled_sep = _attribute(graph, only_sep, _owners(graph, combiner.replaced))
    comb, tangled_comb = _attribute(all_graph, only_comb,
                                    _owners(all_graph, combiner.emitted))
    if tangled_sep is None or tangled_comb is None:
        alone = set(every)
    else:  # a group none of whose nodes were found (renamed by a pass) is priced alone
        alone = tangled_sep | tangled_comb | {i for i in every
                                              if i not in sep or i not in comb}
    decisions = []
    for group in groups:
        if group.index in alone:
            trial_graph, trial, _ = trials[frozenset({group.index})] = planned(
                {group.index}, f"group {group.index} combined alone (its kernels meet another group's)")
            sep_k, comb_k = _affected(graph, plan, trial_graph, trial)
        else:
            sep_k, comb_k = sep[group.index], comb[group.index]
        decisions.append(_decide(group, _stable_names(graph, group), sep_k, comb_k,
                                 combine))
    chosen = frozenset(d.index for d in decisions if d.combined)
    if not chosen:
        out_graph, out = graph, plan
    else:
        out_graph, out, _ = trials.get(chosen) or planned(
            chosen, f"the {len(chosen)} chosen groups combined")
    return out_graph, dataclasses.replace(out, combine=tuple(decisions), **keep)


def module_for_plan(mod: tvm.IRModule, plan: FusionPlan) -> tvm.IRModule:
    """``mod`` with the parallel matmuls ``plan`` combined, combined again.

    Raises
    ------
    PlanError
        The module has no such group (the plan was made for another graph).
    """
    chosen = [d for d in plan.combine if d.combined]
    if not chosen:
        return mod
    have = {g.index: g for g in parallel_matmuls(mod)}
    for d in chosen:
        if d.index not in have or have[d.index].names != d.names:
            raise PlanError(
                f"the plan combines the parallel matmuls {', '.join(d.ops)} (Relax "
                f"{', '.join(d.names)}), which this model does not have: the plan was made "
                "for another graph; plan the model again (tvm-fusion plan MODEL)")
    return combine_matmuls(mod, {d.index for d in chosen})[0]


def graph_for_plan(mod: tvm.IRModule, plan: FusionPlan) -> OpGraph:
    """The graph ``plan`` was made for: ``mod`` with its parallel matmuls combined as the
    plan decided (``plan.combine``), in ``plan.layout``, legalized."""
    return graph_in_layout(module_for_plan(mod, plan), plan.layout)
