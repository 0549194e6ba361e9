"""Sibling (horizontal) groups: independent operators that read the same tensor.

Two groups with no path between them may form one kernel when they read a common
producer's output: the kernel reads that tensor once instead of once per group and is
launched once. TVM does not do this by itself: a PrimFunc with two independent loop
nests still compiles to two GPU kernels (dlight binds each nest to its own grid; checked
with nvcc: two entries) and two parallel regions on the CPU, each reading the shared
input. So a sibling group is only worth its cost when its nests become ONE nest:
:func:`merge_sibling_nests` inlines every block that writes a kernel-private buffer and
merges the remaining output nests loop by loop (``Schedule.merge``). That needs:

- every member elementwise, broadcast or injective (a GEMM or reduction nest has
  reduction loops and a different iteration space);
- exactly one output per connected part of the group (the block left after inlining);
- all those outputs of the same shape (``merge`` needs equal loop extents).

:func:`sibling_violation` says which of these a candidate breaks; the cost model prices
a group that passes as one kernel (its shared input counted once, one launch).
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from ..graph import OpGraph
from .op_info import node_name


def components(graph: OpGraph, members) -> list[frozenset]:
    """The weakly connected parts of ``members`` (by edges inside them), by first node."""
    members = set(members)
    parent = {n: n for n in members}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in members:
        for p in graph.nodes[n].inputs:
            if p in members:
                parent[find(p)] = find(n)
    parts: dict[int, set] = {}
    for n in members:
        parts.setdefault(find(n), set()).add(n)
    return sorted((frozenset(p) for p in parts.values()), key=min)


def sibling_violation(model, members) -> str | None:
    """Why ``members`` (several unconnected parts) cannot share one loop nest, or None.

    Parameters
    ----------
    model : AnalyticalCostModel
        Supplies the graph, the operator roles and which members' results escape.
    members : iterable of int
    """
    members = frozenset(members)
    parts = components(model.graph, members)
    if len(parts) < 2:
        return None
    names = lambda ns: ", ".join(node_name(model.graph.nodes[n]) for n in sorted(ns))  # noqa: E731
    heavy = [n for n in members if model.infos[n].role != "elementwise"]
    if heavy:
        return (f"independent siblings share a kernel only as one elementwise loop nest; "
                f"{names(heavy)} is a {model.infos[heavy[0]].role}")
    split = [n for n in members if len(model.graph.nodes[n].results) > 1]
    if split:  # one nest per result: nothing left to merge them into one
        return (f"{names(split)} has {len(model.graph.nodes[split[0]].results)} outputs, "
                "one loop nest each; sibling parts must be single loop nests")
    sinks = []
    for part in parts:
        outs = [n for n in part if model.escapes(n, members)]
        if len(outs) != 1:
            return (f"sibling part {names(part)} has {len(outs)} outputs; one loop nest per "
                    "part is needed to merge the parts' nests")
        sinks.append(outs[0])
    shapes = {tuple(model.graph.nodes[s].shape) for s in sinks}
    if len(shapes) > 1:
        return (f"the siblings' outputs {names(sinks)} differ in shape "
                f"({', '.join(map(str, sorted(shapes)))}): their loop nests cannot be merged")
    return None


def shared_inputs(graph: OpGraph, a, b) -> list[int]:
    """Nodes outside both groups whose result both ``a`` and ``b`` read."""
    read = lambda g: {p for n in g for p in graph.nodes[n].inputs} - set(a) - set(b)  # noqa: E731
    return sorted(read(a) & read(b))


def merge_sibling_nests(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """One loop nest for a sibling group's PrimFunc (see the module docstring).

    Blocks writing a buffer allocated inside the function are inlined into their
    readers; the output blocks left are merged loop level by loop level. Returns ``func``
    unchanged when it already has one nest; raises the schedule's error when the nests
    cannot be merged (the planner only forms groups for which they can).
    """
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    root = sch.get_sblock("root")
    private = list(sch.get(root).alloc_buffers)
    for block in sch.get_child_blocks(root):
        writes = [w.source for w in sch.get(block).writes]
        if writes and all(any(w.same_as(p) for p in private) for w in writes):
            sch.compute_inline(block)
    blocks = sch.get_child_blocks(root)
    if len(blocks) < 2:
        return func
    for level in range(len(sch.get_loops(blocks[0]))):
        sch.merge(*[sch.get_loops(b)[level] for b in blocks])
    return sch.mod["main"]
