"""Duplication: recompute a cheap producer inside every kernel that reads it.

An elementwise, broadcast or injective operator P (with the cheap operators of its
kernel that feed only it: its chain) whose readers sit in kernels that
cannot be one kernel either runs alone (a launch; its result written to DRAM and read
back by each reader) or sits in one reader's kernel while its result still goes through
DRAM to the others. Put a copy of P into every reading kernel and its result never
reaches DRAM: each reader reads P's inputs instead of P's result, and P's FLOPs run once
per reader. After fusion, the planner tries this for one producer at a time, in
topological order, and keeps it when the analytical model predicts the kernels involved
get faster by at least ``MIN_SAVING`` (2%; a copy also costs compile and tuning time
the model does not see):

    before = sum over P's kernel and its readers' kernels of their predicted time
    after  = sum over the readers' kernels with a copy of P (its result private, not
             written) + P's old kernel without P (when no reader is in it)

A copy must keep every kernel legal (:mod:`.legality`; no copy feeds a GEMM/conv, which
takes no prologue). The plan then holds P in several groups (:func:`~tvm_fusion.plan.
apply.check_plan`). The ``rejected`` merges of a plan describe the partition before
duplication.
"""

from __future__ import annotations

from dataclasses import dataclass

from .apply import DUPLICABLE_KINDS
from .op_info import node_name

MIN_SAVING = 0.02  # of the kernels' time: below it, the model's error outweighs the gain


@dataclass(frozen=True, kw_only=True)
class Duplication:
    """One producer recomputed by several kernels, and why.

    Attributes
    ----------
    node : int
        The duplicated producer (the chain's last operator).
    chain : tuple of int
        Every node copied with it (itself and the cheap operators feeding only it).
    kernels : int
        How many kernels compute it.
    before_us, after_us : float
        Predicted time of the kernels involved without and with the copies.
    """

    node: int
    chain: tuple[int, ...]
    kernels: int
    before_us: float
    after_us: float

    def note(self, graph) -> str:
        """One line for the plan's notes."""
        ops = ", ".join(node_name(graph.nodes[n]) for n in self.chain)
        return (f"{ops} recomputed in each of {self.kernels} kernels "
                f"(its result never goes through DRAM): {self.after_us:.2f} us against "
                f"{self.before_us:.2f} us for the kernels involved")


def groups_acyclic(graph, groups) -> bool:
    """Whether the kernels can run in some order (a reader of a node no copy of which
    is in its own group waits for the first group that computes it)."""
    first = {}
    for gi, g in enumerate(groups):
        for n in g:
            first.setdefault(n, gi)
    succ = {gi: set() for gi in range(len(groups))}
    for gi, g in enumerate(groups):
        for n in g:
            for p in graph.nodes[n].inputs:
                if p not in g:
                    succ[first[p]].add(gi)
    indeg = {gi: 0 for gi in succ}
    for s in succ.values():
        for gi in s:
            indeg[gi] += 1
    ready, seen = [gi for gi, d in indeg.items() if d == 0], 0
    while ready:
        gi = ready.pop()
        seen += 1
        for s in succ[gi]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return seen == len(groups)


def _cheap_chain(graph, users, home, p: int) -> frozenset:
    """``p`` and the cheap operators of its kernel that feed only it (a cast, a
    broadcast, the steps of a mask computation): what a copy of ``p`` must recompute
    so that its kernel's other results do not go through DRAM in its place."""
    chain, stack = {p}, [p]
    while stack:
        for q in graph.nodes[stack.pop()].inputs:
            if (q in home and q not in chain and q not in graph.outputs
                    and graph.nodes[q].kind in DUPLICABLE_KINDS
                    and all(u in chain for u in users[q])):
                chain.add(q)
                stack.append(q)
    return frozenset(chain)


def duplicate_producers(planner, groups) -> tuple[list[frozenset], list[Duplication]]:
    """Copy cheap producers into their readers' kernels where that is predicted faster.

    Parameters
    ----------
    planner : CostPlanner
        Supplies the graph, the legality check and the cost (``planner.cost(nodes,
        private=...)``).
    groups : list of node collections
        The partition made by fusion.

    Returns
    -------
    list of frozenset, list of Duplication
        The groups (a duplicated node in several of them) and what was duplicated.
    """
    graph = planner.graph
    users = graph.consumers()
    groups: list[frozenset | None] = [frozenset(g) for g in groups]
    copies: set[int] = set()
    done: list[Duplication] = []

    def cost(g, dup) -> float:
        return planner.cost(g, private=g & dup).total_us

    for node in graph.nodes:
        p = node.id
        if (node.kind not in DUPLICABLE_KINDS or p in graph.outputs or p in copies
                or any(u in copies for u in users[p])):
            continue
        home = next(i for i, g in enumerate(groups) if g is not None and p in g)
        chain = _cheap_chain(graph, users, groups[home], p)
        readers = sorted({i for i, g in enumerate(groups) if g is not None
                          for u in users[p] if u in g})
        if len(readers) < 2:  # one reader's kernel: a move, not a duplication
            continue
        new = {i: groups[i] | chain for i in readers}
        rest = groups[home] - chain if home not in readers else None
        if any(planner.violation(g) for g in new.values()) or (rest and planner.violation(rest)):
            continue
        after_copies = copies | chain
        before = sum(cost(groups[i], copies) for i in {home, *readers})
        after = (sum(cost(g, after_copies) for g in new.values())
                 + (cost(rest, after_copies) if rest else 0.0))
        if after > before * (1 - MIN_SAVING):
            continue
        trial = list(groups)
        for i, g in new.items():
            trial[i] = g
        if rest is not None:
            trial[home] = rest or None
        if not groups_acyclic(graph, [g for g in trial if g is not None]):
            continue
        groups = trial
        copies |= chain
        done.append(Duplication(node=p, chain=tuple(sorted(chain)), kernels=len(readers),
                                before_us=before, after_us=after))
    return [g for g in groups if g is not None], done
