"""The baseline planner: TVM's own FuseOps, read back over our graph.

FuseOps never looks at the hardware: it fuses by op-kind rules over the post-dominator
tree (an elementwise/broadcast diamond such as HardSwish's ``x * relu6(x + 3) / 6``
joins its conv; injective chains; injective prologues into a reduction). The baseline
runs ``relax.transform.FuseOps`` itself on the legalized module and maps each fused
function back to the graph's nodes, so its plan is the partition stock TVM compiles
(and stock MetaSchedule tunes). It is what the hardware-aware planner has to beat.
"""

from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import GenericConst

from ..graph import OpGraph
from ..graph.op_graph import _is_call_tir, call_tir_bindings, is_node_binding
from .cost import estimate_us
from .fusion_plan import FusedGroup, FusionPlan

log = logging.getLogger(__name__)


class _Unmapped(Exception):
    """A fused function's call could not be matched to one of the graph's nodes."""


def _key(expr, env: dict):
    """A name for the value ``expr`` computes, equal in the module before and after
    FuseOps: a node's output is ("n", id); vars FuseOps keeps (inputs) and constants
    are themselves; tuple glue is followed structurally."""
    if isinstance(expr, relax.Var):
        return env.get(expr, ("v", expr))
    if isinstance(expr, GenericConst):
        return ("c", expr)
    if isinstance(expr, relax.Tuple):
        return ("tuple", tuple(_key(f, env) for f in expr.fields))
    if isinstance(expr, relax.TupleGetItem):
        t = _key(expr.tuple_value, env)
        return t[1][expr.index] if t[0] == "tuple" else ("item", t, expr.index)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return ("call", expr.op.name, tuple(_key(a, env) for a in expr.args))
    return ("s", tvm_ffi.structural_hash(expr))


def _call_key(call, env: dict):
    if not _is_call_tir(call):  # a library node (relax.topk, a runtime call)
        return _key(call, env)
    return (call.args[0].name_hint, tuple(_key(a, env) for a in call.args[1].fields))


def _walk(bindings, env: dict, index: dict, member: list[int]) -> None:
    """Bind each var of ``bindings`` in ``env``; the node ids of their call_tirs go to
    ``member``."""
    for b in bindings:
        if is_node_binding(b):
            node = index.get(_call_key(b.value, env))
            if node is None:
                raise _Unmapped(b.value.args[0].name_hint)
            env[b.var] = ("n", node)
            member.append(node)
        elif not isinstance(b.value, relax.Call) or isinstance(b.value.op, tvm.ir.Op):
            env[b.var] = _key(b.value, env)  # glue: tuples, shape ops
        else:
            raise _Unmapped(str(b.value.op))


def tvm_fuseops_groups(graph: OpGraph) -> list[list[int]]:
    """Partition the graph's nodes as ``relax.transform.FuseOps`` does.

    Raises
    ------
    _Unmapped
        When a fused call cannot be matched to the graph's nodes.
    """
    env: dict = {}
    index: dict = {}
    producer = {b.var: i for i, b in enumerate(call_tir_bindings(graph.mod))}
    for block in graph.mod["main"].body.blocks:
        for b in block.bindings:
            if b.var in producer:
                index[_call_key(b.value, env)] = producer[b.var]
                env[b.var] = ("n", producer[b.var])
            elif not isinstance(b.value, relax.Call) or isinstance(b.value.op, tvm.ir.Op):
                env[b.var] = _key(b.value, env)
    fused = relax.transform.FuseOps()(graph.mod)
    env, groups = {}, []
    for block in fused["main"].body.blocks:
        for b in block.bindings:
            call = b.value
            if isinstance(call, relax.Call) and isinstance(call.op, relax.GlobalVar) \
                    and isinstance(fused[call.op], relax.Function):
                func = fused[call.op]
                inner = {p: _key(a, env) for p, a in zip(func.params, call.args)}
                members: list[int] = []
                for fb in func.body.blocks:
                    _walk(fb.bindings, inner, index, members)
                env[b.var] = _key(func.body.body, inner)
                groups.append(members)
            else:
                members = []
                _walk([b], env, index, members)
                if members:
                    groups.append(members)
    seen = sorted(n for g in groups for n in g)
    if seen != list(range(len(graph.nodes))):
        raise _Unmapped(f"{len(seen)} of {len(graph.nodes)} nodes matched")
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def fuseops_groups(graph: OpGraph) -> list[list[int]]:
    """Partition the graph's nodes as TVM's FuseOps does (:func:`tvm_fuseops_groups`;
    where its result cannot be mapped back, :func:`rule_groups` with a warning)."""
    try:
        return tvm_fuseops_groups(graph)
    except _Unmapped as e:
        log.warning("TVM FuseOps' groups could not be mapped back to the graph (%s); "
                    "using the op-kind rules without post-dominator diamonds", e)
        return rule_groups(graph)


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


def rule_groups(graph: OpGraph) -> list[list[int]]:
    """FuseOps' op-kind rules along single-reader producer chains (no post-dominator
    diamonds): the fallback of :func:`fuseops_groups`."""
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
