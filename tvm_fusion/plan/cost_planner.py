"""The hardware-aware planner: priority fusion by predicted saving, then local search.

1. Start from one group per operator.
2. Priority fusion: every producer -> consumer pair of groups is a candidate merge
   (with the convex closure: the groups on any other path between them join too, which
   covers diamonds and multi-consumer producers), and so is every pair of independent
   sibling groups reading a common producer's result (:mod:`.horizontal`: one loop nest
   reads it once, one launch). Its saving is the predicted time of
   the parts minus that of the merged kernel (:mod:`.cost`). Repeatedly take the largest
   saving; candidates are re-scored lazily when they surface (a merge elsewhere can
   change them) and re-generated around each new group. Merges that break a fusion rule
   (:mod:`.legality`) or save nothing are not made. A merge whose predicted saving is
   within the model's error (``TIE_FRACTION`` of the parts' time, either way) is a
   *tie*: it is made exactly when TVM's FuseOps puts those operators in one kernel
   (:mod:`.baseline`), and its reason says it was a tie. Two merges that compete for one
   group (a chain into the conv before it or into the reduction after it) are a tie too
   when their savings differ by less than the model's *measured* error for the op
   classes involved (its family's ``class_errors``, else ``planner_error``): the one
   FuseOps makes is made.
3. Local search: move single operators out of their group or into a neighbouring one
   while that lowers the total predicted time by more than the model's error and keeps
   the group graph acyclic.
4. Reasons: every kernel keeps its predicted time fused and unfused and the hardware
   term that decided; every pair of neighbouring kernels left apart becomes a
   :class:`~tvm_fusion.plan.fusion_plan.RejectedMerge` with both times and the reason;
   a kernel that matches a canonical chain is named by :mod:`.patterns` (a name only).
"""

from __future__ import annotations

import dataclasses
import heapq

from ..family import strategy
from ..graph import OpGraph
from .baseline import fuseops_groups, kernel_name
from .cost import AnalyticalCostModel, GroupCost, decision_terms, op_class
from .duplicate import duplicate_producers
from .fusion_plan import FusedGroup, FusionPlan, RejectedMerge
from .horizontal import components, shared_inputs, sibling_violation
from .int8 import FALLBACK_NOTE, int8_note, is_int8, reaches_int8_unit
from .patterns import match_pattern
from .legality import GroupGraph, cpu_violation, gpu_violation, violation
from .op_info import graph_info, node_name

EPS_US = 1e-6  # a merge must save more than this to be made
# The model's error on a decision: a saving within this fraction of the parts' predicted
# time (and TIE_FLOOR_US) is a tie, decided by FuseOps. Conservative until the accuracy
# benchmark (benchmarks/planner_accuracy.py) measures it per target: the same model's
# predictions of two partitions of one op chain share their errors (peaks, bandwidth),
# so their difference is known better than either time alone.
TIE_FRACTION = 0.05
TIE_FLOOR_US = 0.05
TIE = "tie (FuseOps' choice)"
# The analytical model's measured median kernel error, max(pred/meas, meas/pred), per op
# class is the target family's ``class_errors``, over all kernels its ``planner_error``
# (tvm_fusion/family/, each with where it was measured). Two merges that compete for one group (an epilogue into a conv or a prologue into the
# reduction after it) differ by where a few operators go, well inside that error: such a
# rivalry is a tie unless the savings differ by more than (error - 1) x the time not shared.
LOCAL_SEARCH_ROUNDS = 3  # passes over all operators per local search
MAX_ROUNDS = 4  # priority fusion + local search rounds


def compute_bound_us(costs) -> float:
    """The compute time of the compute-bound kernels among ``costs`` (their parallel
    fraction included): what a CPU tie margin leaves out (:meth:`CostPlanner.shared_us`)."""
    return sum(c.compute_us / c.parallel_fraction for c in costs if c.bound == "compute")


class CostPlanner:
    """Plan ``graph`` for ``hw`` by predicted time (see the module docstring)."""

    def __init__(self, graph: OpGraph, hw, *, cost_model=None):
        self.graph, self.hw = graph, hw
        self.family = strategy(hw)
        self.infos = graph_info(graph)
        self.model = cost_model or AnalyticalCostModel(graph, hw, self.infos)
        # the rules need the analytical model's facts even when a learned model costs
        self.rules = (self.model if isinstance(self.model, AnalyticalCostModel)
                      else getattr(self.model, "analytical", None)
                      or AnalyticalCostModel(graph, hw, self.infos))
        self.gg = GroupGraph(graph)
        self._fuseops = None
        # ties between competing merges (:meth:`_rival`): (nodes of the merge made, text)
        self.ties: list[tuple[frozenset, str]] = []

    def fuseops_fuses(self, nodes) -> bool:
        """Whether TVM's FuseOps puts all of ``nodes`` in one kernel."""
        if self._fuseops is None:
            self._fuseops = {n: i for i, g in enumerate(fuseops_groups(self.graph)) for n in g}
        return len({self._fuseops[n] for n in nodes}) == 1

    def margin_us(self, parts_us: float, shared_us: float = 0.0) -> float:
        """The model's error on a saving of parts costing ``parts_us`` (see TIE_FRACTION),
        less ``shared_us``, the time both alternatives spend alike (:meth:`shared_us`)."""
        return TIE_FRACTION * max(parts_us - shared_us, 0.0) + TIE_FLOOR_US

    def shared_us(self, fused: GroupCost, parts) -> float:
        """CPUs: the compute time both alternatives of a merge spend (the smaller of the
        two; a kernel's compute counts where it bounds the kernel, parallel fraction
        included). Its error is the compute term's share of peak (:mod:`.cpu_efficiency`),
        the same factor on both sides, so it cancels in their difference and does not
        widen the tie margin. 0 on GPUs (their margin covers the whole time, as before)."""
        if not self.family.shared_compute_cancels:
            return 0.0
        return min(compute_bound_us(parts), compute_bound_us([fused]))

    def take_merge(self, saving: float, parts_us: float, nodes, shared_us: float = 0.0) -> bool:
        """Whether a merge saving ``saving`` us of ``parts_us`` is made: a clear win, or a
        tie that FuseOps makes too."""
        margin = self.margin_us(parts_us, shared_us)
        if saving > margin:
            return True
        return abs(saving) <= margin and self.fuseops_fuses(nodes)

    def violation(self, nodes) -> str | None:
        """Why ``nodes`` may not be one kernel on this target (None: they may)."""
        return (violation(self.graph, self.infos, nodes)
                or gpu_violation(self.rules, nodes)
                or cpu_violation(self.rules, nodes)
                or sibling_violation(self.rules, nodes))

    def cost(self, nodes, private=()) -> GroupCost:
        """Predicted cost of one kernel (``private``: members other kernels recompute)."""
        private = frozenset(private)
        if private:  # only the analytical model knows private results (duplication)
            return self.model.group_cost(nodes, private=private)
        return self.model.group_cost(nodes)

    def evaluate(self, a: int, b: int, sibling: bool = False):
        """(gids, violation, fused cost, parts' costs) of merging ``a`` into ``b``
        (``sibling``: ``a`` and ``b`` are independent readers of a common tensor)."""
        gids = {a, b} if sibling else self.gg.closure(a, b)
        nodes = frozenset().union(*(self.gg.members[g] for g in gids))
        parts = [self.cost(self.gg.members[g]) for g in sorted(gids)]
        bad = self.violation(nodes)
        return gids, bad, (None if bad else self.cost(nodes)), parts

    def independent(self, a: int, b: int) -> bool:
        """Whether no path of groups joins ``a`` and ``b`` (either way)."""
        return not self.gg.reaches(a, b) and not self.gg.reaches(b, a)

    def siblings(self, gid: int | None = None) -> list[tuple[int, int]]:
        """Independent pairs of groups that read a common producer's result (those with
        ``gid`` only, when given)."""
        gg, pairs = self.gg, set()
        # a pair with ``gid`` reads a result ``gid`` reads: only its producers can have one
        nodes = (self.graph.nodes if gid is None else
                 [self.graph.nodes[p] for p in sorted({p for n in gg.members[gid]
                                                       for p in self.graph.nodes[n].inputs})])
        for node in nodes:
            readers = sorted({gg.group_of[u] for u in gg.users[node.id]}
                             - {gg.group_of[node.id]})
            for i, a in enumerate(readers):
                for b in readers[i + 1:]:
                    if gid in (None, a, b) and (a, b) not in pairs and self.independent(a, b):
                        pairs.add((a, b))
        return sorted(pairs)

    def _key(self, saving, fused, a, b, sibling):
        """Heap order: largest saving first; on a tie (to 1 ns) a merge into a GEMM/conv
        (an epilogue, as FuseOps would make it) before one into a reduction's prologue."""
        epilogue = any(self.infos[n].role == "contraction" for n in fused.nodes)
        return (-round(saving, 3), not epilogue, a, b, sibling)

    def _push(self, heap, a, b, sibling=False):
        _, bad, fused, parts = self.evaluate(a, b, sibling)
        if bad is None:
            unfused = sum(p.total_us for p in parts)
            saving = unfused - fused.total_us
            if self.take_merge(saving, unfused, fused.nodes, self.shared_us(fused, parts)):
                heapq.heappush(heap, self._key(saving, fused, a, b, sibling))

    def priority_fusion(self) -> int:
        """Make every profitable merge, largest saving first; return how many."""
        merges = 0
        heap: list = []
        for a, b in self.gg.edges():
            self._push(heap, a, b)
        for a, b in self.siblings():
            self._push(heap, a, b, True)
        while heap:
            _, _, a, b, sibling = heapq.heappop(heap)
            if a not in self.gg.members or b not in self.gg.members:
                continue
            if sibling and not self.independent(a, b):  # a merge elsewhere joined them
                continue
            gids, bad, fused, parts = self.evaluate(a, b, sibling)
            if bad is not None:
                continue
            unfused = sum(p.total_us for p in parts)
            saving = unfused - fused.total_us
            if not self.take_merge(saving, unfused, fused.nodes, self.shared_us(fused, parts)):
                continue
            if heap and round(saving, 3) < -heap[0][0]:  # stale score: re-queue
                heapq.heappush(heap, self._key(saving, fused, a, b, sibling))
                continue
            rival = self._rival(heap, gids, fused, saving, parts)
            if rival is not None:  # a competing merge within the error: FuseOps' choice
                heapq.heappush(heap, self._key(saving, fused, a, b, sibling))
                gids = rival
            new = self.gg.merge(gids)
            merges += 1
            for p in self.gg.pred(new):
                self._push(heap, p, new)
            for s in self.gg.succ(new):
                self._push(heap, new, s)
            for x, y in self.siblings(new):
                self._push(heap, x, y, True)
        return merges

    def rivalry_us(self, parts, shared_us: float = 0.0) -> float:
        """The measured error on the choice between two competing merges of ``parts``
        (their :class:`GroupCost`; ``shared_us`` left out as in :meth:`margin_us`): each
        part's time at the error measured for its op class (the family's
        ``class_errors``; a GEMM's is not a reduction's)."""
        parts_us = sum(p.total_us for p in parts)
        if parts_us <= 0:
            return TIE_FLOOR_US
        err = sum((self.family.error_of(op_class(self.graph, self.infos, p.nodes)) - 1.0)
                  * p.total_us for p in parts) / parts_us
        return err * max(parts_us - shared_us, 0.0) + TIE_FLOOR_US

    def _rival(self, heap, gids, fused: GroupCost, saving: float, parts):
        """Merges that compete with the one about to be made (they take one of its
        groups) and save within the model's error of it are alternatives the model cannot
        tell apart: a tie, which goes to FuseOps' choice (an epilogue into the conv
        rather than a prologue into the reduction after it, say). Returns the groups of
        the rival to make instead (None: make this one) and records the tie either way
        (:attr:`ties`, for the reasons)."""
        unfused = sum(p.total_us for p in parts)
        margin = self.rivalry_us(parts, self.shared_us(fused, parts))
        mine = self.fuseops_fuses(fused.nodes)
        best = None  # the best-saving rival on FuseOps' other side of this merge
        for key in heap:
            x, y, sib = key[2:]
            if -key[0] < saving - margin - 1e-3 or not ({x, y} & gids):
                continue
            if x not in self.gg.members or y not in self.gg.members:
                continue
            if sib and not self.independent(x, y):
                continue
            gids2, bad, fused2, parts2 = self.evaluate(x, y, sib)
            if bad is not None or gids2 == gids or self.fuseops_fuses(fused2.nodes) == mine:
                continue
            unfused2 = sum(p.total_us for p in parts2)
            saving2, shared2 = unfused2 - fused2.total_us, self.shared_us(fused2, parts2)
            m = max(margin, self.rivalry_us(parts2, shared2))
            if abs(saving2 - saving) > m or not self.take_merge(saving2, unfused2,
                                                                fused2.nodes, shared2):
                continue
            if best is None or saving2 > best[1]:
                best = (gids2, saving2, fused2, m)
        if best is None:
            return None
        gids2, saving2, fused2, m = best
        won, lost, s_won, s_lost = ((fused, fused2, saving, saving2) if mine else
                                    (fused2, fused, saving2, saving))
        names = self._names(frozenset(lost.nodes) - frozenset(won.nodes))
        rival = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self.ties.append((frozenset(won.nodes), (
            f"tie: this merge saves {s_won:.2f} us, the rival one with {rival} "
            f"{s_lost:.2f} us, within the model's error (+-{m:.2f} us), so FuseOps' "
            "choice; ")))
        return None if mine else gids2

    def _try_move(self, nid: int, dest: int | None) -> bool:
        """Move ``nid`` into group ``dest`` (None: alone) if that lowers the total."""
        gg = self.gg
        src = gg.group_of[nid]
        rest = gg.members[src] - {nid}
        target = frozenset({nid}) | (gg.members[dest] if dest is not None else frozenset())
        if dest is not None and self.violation(target):
            return False
        if rest and self.violation(rest):  # e.g. siblings left without a shared nest
            return False
        olds = [self.cost(self.gg.members[g]) for g in [src] + ([dest] if dest is not None else [])]
        news = [self.cost(target)] + ([self.cost(rest)] if rest else [])
        before = sum(c.total_us for c in olds)
        after = sum(c.total_us for c in news)
        shared = 0.0 if not self.family.shared_compute_cancels \
            else min(map(compute_bound_us, (olds, news)))
        if after >= before - max(EPS_US, self.margin_us(before, shared)):
            return False
        saved = gg.state()
        gg.replace([src] + ([dest] if dest is not None else []),
                   [target, rest] if rest else [target])
        if gg.is_acyclic():
            return True
        gg.restore(saved)
        return False

    def local_search(self) -> int:
        """Move single operators while that lowers the total; return how many moves."""
        moves = 0
        for _ in range(LOCAL_SEARCH_ROUNDS):
            moved = False
            for node in self.graph.nodes:
                nid = node.id
                src = self.gg.group_of[nid]
                near = {self.gg.group_of[x] for x in
                        (*node.inputs, *self.gg.users[nid])} - {src}
                options = ([None] if len(self.gg.members[src]) > 1 else []) + sorted(near)
                for dest in options:
                    if self._try_move(nid, dest):
                        moved = True
                        moves += 1
                        break
            if not moved:
                break
        return moves

    def plan(self) -> FusionPlan:
        """Alternate priority fusion and local search until neither changes anything.

        Each step strictly lowers the total predicted time, so this ends (at the latest
        after ``MAX_ROUNDS``); then no neighbouring pair of groups is a legal merge that
        saves time, which is what the ``rejected`` list reports.
        """
        for _ in range(MAX_ROUNDS):
            if not self.priority_fusion() + self.local_search():
                break
        if not (isinstance(self.model, AnalyticalCostModel)  # needs private results
                or getattr(self.model, "prices_private", False)):
            return self.describe(planner="cost")
        groups, dups = duplicate_producers(self, self.gg.groups())
        return self.describe(planner="cost", groups=groups, duplications=dups)

    # ---- reasons ------------------------------------------------------------------

    def _names(self, nodes) -> tuple[str, ...]:
        return tuple(node_name(self.graph.nodes[n]) for n in sorted(nodes))

    def rejected(self) -> list[RejectedMerge]:
        """Every pair of neighbouring groups left apart, with why."""
        out = []
        for a, b in self.gg.edges():
            gids, bad, fused, parts = self.evaluate(a, b)
            nodes = [n for g in gids for n in self.gg.members[g]]
            unfused = sum(p.total_us for p in parts)
            if bad is not None:
                out.append(RejectedMerge(ops=self._names(nodes), reason=f"not fusable: {bad}",
                                         fused_us=None, unfused_us=unfused,
                                         decided_by="fusion rule"))
                continue
            term, text = explain_terms(fused, parts, accepted=False)
            shared = self.shared_us(fused, parts)
            if abs(unfused - fused.total_us) <= self.margin_us(unfused, shared):
                term, text = TIE, self.tie_text(fused.total_us, unfused, fused=False,
                                                shared_us=shared) + text
            else:
                text = f"fusing is predicted slower: {text}"
            out.append(RejectedMerge(
                ops=self._names(nodes), fused_us=fused.total_us, unfused_us=unfused,
                decided_by=term, reason=text))
        for a, b in self.siblings():  # sibling merges not made
            gids, bad, fused, parts = self.evaluate(a, b, sibling=True)
            nodes = self.gg.members[a] | self.gg.members[b]
            note = self._sibling_note(self.gg.members[a], self.gg.members[b])
            if bad is not None:
                out.append(RejectedMerge(ops=self._names(nodes), fused_us=None,
                                         unfused_us=sum(p.total_us for p in parts),
                                         reason=f"{note}; not fusable: {bad}",
                                         decided_by="fusion rule"))
                continue
            term, text = explain_terms(fused, parts, accepted=False)
            out.append(RejectedMerge(
                ops=self._names(nodes), fused_us=fused.total_us,
                unfused_us=sum(p.total_us for p in parts), decided_by=term,
                reason=f"{note}; fusing is predicted slower: {text}"))
        return out

    def tie_text(self, fused_us: float, unfused_us: float, *, fused: bool,
                 shared_us: float = 0.0) -> str:
        """The reason's head for a decision within the model's error."""
        what = "one kernel" if fused else "apart"
        margin = self.margin_us(unfused_us, shared_us)
        return (f"tie: {fused_us:.2f} us fused vs {unfused_us:.2f} us apart is within the "
                f"model's error (+-{margin:.2f} us), so FuseOps' choice: {what}; ")

    def _sibling_note(self, a, b) -> str:
        shared = ", ".join(node_name(self.graph.nodes[n]) for n in shared_inputs(self.graph, a, b))
        return f"siblings reading {shared} (one loop nest)"

    def describe(self, *, planner: str, groups=None, duplications=()) -> FusionPlan:
        """The current partition (or ``groups``, where the ``duplications`` put some
        nodes in several groups) as a :class:`FusionPlan` with every reason."""
        rejected = self.rejected()
        copies = {n: d for d in duplications for n in d.chain}
        parts_of = sorted((sorted(g) for g in groups), key=lambda g: g[0]) if groups else (
            self.gg.groups())
        groups, taken = [], set()
        for nodes in parts_of:
            mine = list(dict.fromkeys(copies[n] for n in nodes if n in copies))
            fused = self.cost(nodes, private=[n for d in mine for n in d.chain])
            parts = [self.cost([n]) for n in nodes]
            unfused = sum(p.total_us for p in parts)
            names = self._names(nodes)
            if len(nodes) > 1:
                term, text = explain_terms(fused, parts, accepted=True)
                built = fused.resources.kernels if fused.resources is not None and \
                    fused.resources.source else 1
                one = "one kernel" if built == 1 else f"one group ({built} kernels compiled)"
                reason = (f"fused: {fused.total_us:.2f} us as {one} vs {unfused:.2f} us "
                          f"as {len(nodes)}; {text}")
                shared = self.shared_us(fused, parts)
                if abs(unfused - fused.total_us) <= self.margin_us(unfused, shared):
                    term = TIE
                    reason = self.tie_text(fused.total_us, unfused, fused=True,
                                           shared_us=shared) + text
                # a rivalry decided this kernel (a tie), or a step of its merges
                exact = [t for m, t in self.ties if m == frozenset(nodes)]
                steps = [t for m, t in self.ties if m < frozenset(nodes)]
                if exact and term != TIE:
                    term, reason = TIE, exact[-1] + reason
                elif steps:
                    reason += f"; one of its merges was a {steps[-1].rstrip('; ')}"
                comps = components(self.graph, nodes)
                if len(comps) > 1:
                    note = self._sibling_note(comps[0], frozenset(nodes) - comps[0])
                    reason = f"{note}; {reason}"
            elif self.graph.nodes[nodes[0]].data_dependent:
                node = self.graph.nodes[nodes[0]]
                term = "fusion rule"
                reason = (f"not fusable: data-dependent output ({node.data_dependent}); a "
                          f"kernel of its own, lowered by TVM")
            else:
                near = [r for r in rejected if names[0] in r.ops]
                term = near[0].decided_by if near else "no neighbour"
                reason = ("alone: " + "; ".join(
                    f"with {', '.join(o for o in r.ops if o != names[0])}: {r.reason}"
                    for r in near[:2])) if near else "alone: no operator to fuse with"
            if len(nodes) == 1 and resources_note(fused):
                reason += f"; {resources_note(fused)}"
            for d in mine:
                reason += f"; {d.note(self.graph)}"
            if fused.source != "analytical":  # a learned model priced it (or declined)
                reason += f"; {fused.source}"
            int8 = [self.graph.nodes[n].op for n in nodes if self.graph.nodes[n].kind == "gemm"
                    and is_int8(self.rules.operand_dtype(n))]
            if int8:
                reason += f"; {int8_note(self.hw)}" \
                    if all(reaches_int8_unit(self.hw, op) for op in int8) else f"; {FALLBACK_NOTE}"
            chain = len(components(self.graph, nodes)) == 1  # siblings are no chain
            match = match_pattern(self.graph, nodes) if chain else None
            if match:
                reason = f"pattern {match.name}; {reason}"
            name, k = kernel_name(self.graph, nodes), 1
            base = name
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            taken.add(name)
            groups.append(FusedGroup(
                nodes=tuple(nodes), name=name, est_us=fused.total_us, reason=reason,
                ops=names, unfused_us=unfused, decided_by=term,
                pattern=match.name if match else "",
                kept_on_chip_bytes=sum(p.dram_bytes for p in parts) - fused.dram_bytes))
        return FusionPlan(target=self.hw.name, graph_signature=self.graph.signature,
                          planner=planner, groups=tuple(groups), rejected=tuple(rejected),
                          notes=tuple(d.note(self.graph) for d in duplications))


def explain_terms(fused: GroupCost, parts: list[GroupCost], *, accepted: bool):
    """(deciding term, text) for a merge; the formulas are in :mod:`.cost`."""
    terms = decision_terms(fused, parts)
    pick = max if accepted else min
    term = pick(terms, key=terms.get)
    text = ", ".join(f"{k} {v:+.2f} us" for k, v in terms.items() if abs(v) >= 0.005)
    notes = []
    if fused.staged_bytes:
        fit = "fits" if fused.fits else "does not fit"
        notes.append(f"row of {fused.staged_bytes} B staged on chip {fit} in "
                     f"{fused.onchip_bytes} B")
        if not fused.fits and not accepted:
            term = "on-chip capacity"
    if fused.parallel_fraction < 1 and fused.blocks_per_unit:  # a GPU (see gpu_terms)
        notes.append(f"{fused.tiles} blocks at {fused.blocks_per_unit} per unit "
                     f"(occupancy {fused.occupancy:.0%}) in {fused.waves} wave(s), "
                     f"latency hidden {fused.latency_hiding:.0%}")
    elif fused.parallel_fraction < 1:
        notes.append(f"{fused.tiles} tiles on {round(fused.tiles / fused.parallel_fraction)} "
                     "units")
    built = resources_note(fused, occupancy=not (fused.parallel_fraction < 1))
    if built:
        notes.append(built)
    text = f"decided by {term} (saving per term: {text or 'none'})"
    return term, text + ("; " + "; ".join(notes) if notes else "")


def resources_note(cost: GroupCost, *, occupancy: bool = True) -> str:
    """What a compiler allocated for the kernel of ``cost`` (and, with ``occupancy``, the
    blocks per unit that allows), against the estimate; "" where the numbers are the
    estimate's (:mod:`.gpu_resources`)."""
    res = cost.resources
    if res is None or not res.source:
        return ""
    amd = res.source.startswith("gfx")
    unit, mem, where = ("VGPRs per lane", "LDS", "CU") if amd else (
        "registers per thread", "shared", "SM")
    est = ("as estimated" if res.estimated_registers == res.registers_per_thread
           else f"estimated {res.estimated_registers}")
    text = (f"compiled ({res.source}): {res.registers_per_thread} {unit} ({est}), "
            f"{res.shared_bytes} B {mem}, {res.threads_per_block} threads")
    if res.spill_bytes:
        text += f", {res.spill_bytes} B per thread spilled"
    if occupancy:
        text += f": {cost.blocks_per_unit} blocks per {where}, occupancy {cost.occupancy:.0%}"
    return text


def plan_cost(graph: OpGraph, hw, *, cost_model=None) -> FusionPlan:
    """Plan ``graph`` for ``hw`` by predicted time (priority fusion + local search).

    Parameters
    ----------
    graph : OpGraph
    hw : HardwareTarget
    cost_model : object, optional
        Anything with ``group_cost(nodes) -> GroupCost``; the analytical model by default
        (the seam where a learned model's prediction replaces it).
    """
    return CostPlanner(graph, hw, cost_model=cost_model).plan()


def describe_groups(graph: OpGraph, hw, plan: FusionPlan, *, cost_model=None) -> FusionPlan:
    """``plan`` with every group's predicted time and reason given afresh by
    ``cost_model`` (as :func:`plan_cost`), its partition kept: e.g. once a compiler has
    reported what its kernels hold (:mod:`tvm_fusion.gpu.resources`)."""
    planner = CostPlanner(graph, hw, cost_model=cost_model)
    planner.gg = GroupGraph(graph, [g.nodes for g in plan.groups])
    described = planner.describe(planner=plan.planner)
    return dataclasses.replace(plan, groups=described.groups)


def describe_plan(graph: OpGraph, hw, plan: FusionPlan, *, cost_model=None) -> FusionPlan:
    """``plan``'s partition with ops, predicted times and reasons from the cost model
    (``cost_model``: as :func:`plan_cost`).

    Used for FuseOps-rule plans, so they can be compared with cost plans; the planner
    name and the rule-based reasons of multi-op groups are kept.
    """
    planner = CostPlanner(graph, hw, cost_model=cost_model)
    planner.gg = GroupGraph(graph, [g.nodes for g in plan.groups])
    described = {frozenset(g.nodes): g for g in planner.describe(planner=plan.planner).groups}
    groups = []
    for old in plan.groups:
        g = described[frozenset(old.nodes)]
        groups.append(FusedGroup(
            nodes=old.nodes, name=old.name, est_us=g.est_us, reason=old.reason or g.reason,
            ops=g.ops, unfused_us=g.unfused_us, kept_on_chip_bytes=g.kept_on_chip_bytes,
            decided_by="op-kind rules" if len(g.nodes) > 1 else g.decided_by,
            pattern=g.pattern))
    return FusionPlan(target=plan.target, graph_signature=plan.graph_signature,
                      planner=plan.planner, groups=tuple(groups), notes=plan.notes,
                      layout=plan.layout, layout_reason=plan.layout_reason,
                      combine=plan.combine)
