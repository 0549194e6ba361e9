"""The baseline planner: TVM FuseOps' op-kind rules, over our graph.

It never looks at the hardware beyond the cost it reports: a producer-consumer pair is
fused when the producer's group has no other reader and the pattern rules allow it
(elementwise/broadcast into any epilogue, injective chains, injective prologues into a
reduction). It is what the hardware-aware planner has to beat.
"""

from __future__ import annotations

from ..graph import OpGraph
from .cost import estimate_us
from .fusion_plan import FusedGroup, FusionPlan

_LEVEL = {"elemwise": 0, "broadcast": 1, "injective": 2, "reduction": 3, "gemm": 4,
          "tuple": 8, "opaque": 8}


def _can_follow(group_level: int, kind: str) -> bool:
    """May a node of ``kind`` join, as consumer, a group whose strongest op is ``group_level``."""
    if kind in ("elemwise", "broadcast"):
        return group_level <= _LEVEL["gemm"]
    if kind == "injective":
        return group_level <= _LEVEL["injective"]
    if kind == "reduction":
        return group_level <= _LEVEL["injective"]
    return False  # gemm, opaque: FuseOps never fuses producers into them


def fuseops_groups(graph: OpGraph) -> list[list[int]]:
    """Partition the graph's nodes as FuseOps' rules do."""
    users = graph.consumers()
    group = {n.id: [n.id] for n in graph.nodes}  # node -> its group's member list (shared)
    for node in graph.nodes:
        producer_groups = []
        for p in node.inputs:
            members = group[p]
            if any(members is g for g in producer_groups):
                continue
            level = max(_LEVEL[graph.nodes[m].kind] for m in members)
            external = {u for m in members for u in users[m] if u not in members}
            is_output = any(m in graph.outputs for m in members)
            if external == {node.id} and not is_output and _can_follow(level, node.kind):
                producer_groups.append(members)
        if not producer_groups:
            continue
        # At most one gemm/reduction anchor per kernel, as in FuseOps.
        anchors = [g for g in producer_groups
                   if max(_LEVEL[graph.nodes[m].kind] for m in g) >= _LEVEL["reduction"]]
        if len(anchors) > 1:
            producer_groups = [anchors[0]] + [g for g in producer_groups if g not in anchors]
        merged = sorted({m for g in producer_groups for m in g} | {node.id})
        for m in merged:
            group[m] = merged
    seen: dict[int, list[int]] = {}
    for members in group.values():
        seen.setdefault(id(members), members)
    return sorted(seen.values(), key=lambda g: g[0])


def kernel_name(graph: OpGraph, nodes) -> str:
    """FuseOps-style name: ``fused_`` and the operator names, shortened."""
    ops = [graph.nodes[n].op for n in nodes]
    if len(ops) == 1:
        return ops[0]
    name = "fused_" + "_".join(ops)
    return name if len(name) <= 80 else name[:72] + f"_{len(ops)}ops"


def plan_from_groups(graph: OpGraph, groups, hw, *, planner: str,
                     reasons=None) -> FusionPlan:
    """Wrap a partition into a :class:`FusionPlan` with names and predicted times."""
    out = []
    taken: set[str] = set()
    for i, nodes in enumerate(groups):
        nodes = tuple(sorted(nodes))
        name = kernel_name(graph, nodes)
        base, k = name, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        reason = reasons[i] if reasons else ""
        out.append(FusedGroup(nodes=nodes, name=name, est_us=estimate_us(graph, nodes, hw),
                              reason=reason))
    return FusionPlan(target=hw.name, graph_signature=graph.signature, planner=planner,
                      groups=tuple(out))


def plan_fuseops(graph: OpGraph, hw) -> FusionPlan:
    """The FuseOps-equivalent plan of ``graph`` on ``hw``."""
    groups = fuseops_groups(graph)
    reasons = []
    for g in groups:
        kinds = [graph.nodes[n].kind for n in g]
        if len(g) == 1:
            reasons.append(f"alone: a {kinds[0]} op whose neighbours the rules cannot take")
        else:
            reasons.append("fused by op-kind rules: " + " -> ".join(kinds))
    return plan_from_groups(graph, groups, hw, planner="fuseops-rules", reasons=reasons)
