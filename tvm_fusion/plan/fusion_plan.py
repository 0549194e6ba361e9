"""The fusion plan: which operators share a kernel, and why.

A plan is plain data: JSON-serializable, versioned, hashed, and bound to the operator
graph it was made for (by the graph's signature), so it can be stored with tuning logs
and re-applied at deployment exactly as it was tuned.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import PlanError
from ..targets import format_bytes
from .compare import PlanComparison

PLAN_SCHEMA = "tvm-fusion/plan"
PLAN_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class FusedGroup:
    """One kernel of the plan.

    Attributes
    ----------
    nodes : tuple of int
        Ids of the :class:`~tvm_fusion.graph.OpNode` it computes, in topological order.
    name : str
        Kernel name (``fused_conv2d_add_relu``).
    est_us : float
        Predicted time of the kernel on the plan's target, in microseconds.
    reason : str
        Why these operators are together (or why the node stands alone).
    ops : tuple of str
        Stable names of the nodes (``<op>#<id>``), same order as ``nodes``.
    unfused_us : float
        Predicted time of the same operators as one kernel each.
    kept_on_chip_bytes : int
        DRAM bytes avoided: what the unfused kernels would move and this one does not
        (the JSON field keeps its old name; :attr:`dram_bytes_avoided` reads it).
    decided_by : str
        The hardware term that decided (``launch overhead``, ``DRAM traffic``,
        ``compute``, ``parallelism``, ``on-chip capacity``), or the planner's rule.
    pattern : str
        The canonical chain the kernel matches (``Conv-BN-HardSwish``, ``attention score
        path (MatMul-Scale-Mask-Softmax)``; :mod:`~tvm_fusion.plan.patterns`), or ``""``.
        A name only: the predicted time made the group.
    resources : dict
        GPU plans made with a compiler's numbers (:mod:`tvm_fusion.gpu.resources`): what
        it allocated for the kernel (``source``, ``registers``, ``shared_bytes``,
        ``spill_bytes``, ``threads_per_block``, ``kernels``, ``blocks_per_unit``,
        ``occupancy``, ``waves_per_simd`` on gfx90a) and the estimate's
        ``predicted_registers``; empty otherwise.
    """

    nodes: tuple[int, ...]
    name: str
    est_us: float = 0.0
    reason: str = ""
    ops: tuple[str, ...] = ()
    unfused_us: float = 0.0
    kept_on_chip_bytes: int = 0
    decided_by: str = ""
    pattern: str = ""
    resources: dict = field(default_factory=dict, compare=False)

    @property
    def predicted_us(self) -> float:
        """Predicted time of the kernel on the plan's target (same as ``est_us``)."""
        return self.est_us

    @property
    def dram_bytes_avoided(self) -> int:
        """DRAM bytes the unfused kernels would move and this one does not."""
        return self.kept_on_chip_bytes


@dataclass(frozen=True, kw_only=True)
class RejectedMerge:
    """A merge of neighbouring groups the planner considered and did not make.

    ``fused_us`` is None when the merge breaks a fusion rule (``reason`` says which).
    """

    ops: tuple[str, ...]
    reason: str
    fused_us: float | None
    unfused_us: float
    decided_by: str = ""


@dataclass(frozen=True, kw_only=True)
class CombinedMatmuls:
    """The planner's decision on one group of parallel matmuls reading one input (Q/K/V):
    combine them into one wide matmul and a split, or keep them apart
    (:mod:`~tvm_fusion.plan.combine`).

    Attributes
    ----------
    index : int
        The group's position among the module's candidates
        (:func:`tvm_fusion.simplify.parallel.parallel_matmuls`).
    names : tuple of str
        The matmuls' Relax variables (checked when the graph is rebuilt).
    ops : tuple of str
        Their stable names in the separate graph (``matmul#12``).
    combined : bool
        Whether the plan's graph has them combined.
    separate_us, combined_us : float
        Predicted time of the kernels the two plans do not share, apart and combined.
    separate_kernels, combined_kernels : int
        How many kernels those are.
    reason : str
        The comparison that decided.
    """

    index: int
    names: tuple[str, ...]
    ops: tuple[str, ...]
    combined: bool
    separate_us: float
    combined_us: float
    separate_kernels: int = 0
    combined_kernels: int = 0
    reason: str = ""

    def summary(self) -> str:
        """One line, e.g. ``combined 3 parallel matmuls (matmul#1, ...) into one: ...``."""
        ops = ", ".join(self.ops)
        times = (f"{self.separate_us:.1f} -> {self.combined_us:.1f} us predicted, "
                 f"{self.separate_kernels} -> {self.combined_kernels} kernels")
        if self.combined:
            return f"combined {len(self.ops)} parallel matmuls ({ops}) into one: {times}"
        return (f"kept {len(self.ops)} parallel matmuls ({ops}) apart: combined would be "
                f"{times}")

    @classmethod
    def from_json(cls, d: dict) -> "CombinedMatmuls":
        return cls(index=int(d["index"]), names=tuple(d["names"]), ops=tuple(d["ops"]),
                   combined=bool(d["combined"]), separate_us=float(d["separate_us"]),
                   combined_us=float(d["combined_us"]),
                   separate_kernels=int(d.get("separate_kernels", 0)),
                   combined_kernels=int(d.get("combined_kernels", 0)),
                   reason=d.get("reason", ""))


@dataclass(frozen=True, kw_only=True)
class FusionPlan:
    """The kernels of a graph: a partition of its operators, except that a cheap
    producer may be recomputed by several kernels (:mod:`~tvm_fusion.plan.duplicate`;
    the plan's ``notes`` say which).

    ``edges`` holds the graph's producer -> consumer node-id pairs, so that a plan
    read back from JSON can still be drawn (``explore.plan_html``); it is not in the hash.

    ``layout`` is the activation layout of the module's convolutions the graph was built
    in (``NCHW`` or ``NCHW{c}c``, :mod:`~tvm_fusion.plan.layout`) and ``layout_reason``
    why; a plan written before the field existed is ``NCHW``. The graph signature
    already differs between layouts, so the layout is not in the hash.

    ``combine`` holds the decision on each group of parallel matmuls (Q/K/V) of the
    module (:mod:`~tvm_fusion.plan.combine`); the graph was built with the groups marked
    ``combined`` merged. A plan without it combines nothing. Like the layout it is not in
    the hash: a combined graph has another signature.
    """

    target: str
    graph_signature: str
    planner: str
    groups: tuple[FusedGroup, ...]
    notes: tuple[str, ...] = field(default=())
    rejected: tuple[RejectedMerge, ...] = field(default=())
    edges: tuple[tuple[int, int], ...] = field(default=())
    layout: str = "NCHW"
    layout_reason: str = ""
    combine: tuple[CombinedMatmuls, ...] = field(default=())

    @property
    def est_us(self) -> float:
        """Predicted time of all kernels, in microseconds."""
        return sum(g.est_us for g in self.groups)

    @property
    def hash(self) -> str:
        """Content hash of the partition (target, graph and groups; not the reasons)."""
        key = [self.target, self.graph_signature, [list(g.nodes) for g in self.groups]]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    def group_of(self) -> dict[int, int]:
        """Map node id to the index of its group (a duplicated node: its last one)."""
        return {n: gi for gi, g in enumerate(self.groups) for n in g.nodes}

    def to_json(self) -> dict:
        """The plan as a JSON-ready dict with its schema, version and hash."""
        d = asdict(self)
        d["groups"] = [{**asdict(g), "predicted_us": g.est_us} for g in self.groups]
        d["rejected"] = [asdict(r) for r in self.rejected]
        if not self.combine:  # plans without parallel matmuls read as before
            del d["combine"]
        return {"schema": PLAN_SCHEMA, "version": PLAN_VERSION, "hash": self.hash, **d}

    @classmethod
    def from_json(cls, d: dict) -> "FusionPlan":
        """Read a plan written by :meth:`to_json`; refuse other schemas and versions."""
        if d.get("schema") != PLAN_SCHEMA or d.get("version") != PLAN_VERSION:
            raise PlanError(
                f"not a tvm-fusion plan of version {PLAN_VERSION}: got schema "
                f"{d.get('schema')!r} version {d.get('version')!r}; re-create it with "
                "`tvm-fusion plan MODEL --json OUT`")
        groups = tuple(FusedGroup(nodes=tuple(g["nodes"]), name=g["name"],
                                  est_us=float(g.get("est_us", 0.0)),
                                  reason=g.get("reason", ""), ops=tuple(g.get("ops", ())),
                                  unfused_us=float(g.get("unfused_us", 0.0)),
                                  kept_on_chip_bytes=int(g.get("kept_on_chip_bytes", 0)),
                                  decided_by=g.get("decided_by", ""),
                                  pattern=g.get("pattern", ""),
                                  resources=dict(g.get("resources", {})))
                       for g in d["groups"])
        rejected = tuple(RejectedMerge(ops=tuple(r["ops"]), reason=r["reason"],
                                       fused_us=r["fused_us"], unfused_us=r["unfused_us"],
                                       decided_by=r.get("decided_by", ""))
                         for r in d.get("rejected", ()))
        plan = cls(target=d["target"], graph_signature=d["graph_signature"],
                   planner=d["planner"], groups=groups, notes=tuple(d.get("notes", ())),
                   rejected=rejected,
                   edges=tuple((int(a), int(b)) for a, b in d.get("edges", ())),
                   layout=d.get("layout", "NCHW"), layout_reason=d.get("layout_reason", ""),
                   combine=tuple(CombinedMatmuls.from_json(c) for c in d.get("combine", ())))
        if d.get("hash") not in (None, plan.hash):
            raise PlanError(f"plan hash mismatch: file says {d['hash']}, content gives "
                            f"{plan.hash}; the plan was edited by hand or is corrupt")
        return plan

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FusionPlan":
        """Read a plan saved by :meth:`save`."""
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise PlanError(f"cannot read fusion plan {path}: {e}") from e

    def summary(self) -> str:
        """A text table: one row per kernel, predicted time and DRAM bytes avoided."""
        rows = [f"{'#':>3}  {'est us':>9}  {'DRAM -':>9}  {'ops':>3}  kernel / operators"]
        for i, g in enumerate(self.groups):
            rows.append(f"{i:>3}  {g.est_us:>9.2f}  {format_bytes(g.kept_on_chip_bytes):>9}  "
                        f"{len(g.nodes):>3}  {g.name}")
            if g.reason:
                rows.append(f"{'':>34}{g.reason}")
        kept = sum(g.kept_on_chip_bytes for g in self.groups)
        rows.append(f"{len(self.groups)} kernels, predicted {self.est_us:.1f} us on "
                    f"{self.target} (planner: {self.planner}), {format_bytes(kept)} DRAM "
                    f"bytes avoided; {len(self.rejected)} merges rejected")
        if self.layout_reason or self.layout != "NCHW":
            rows.append(f"layout {self.layout}: {self.layout_reason or 'as stored'}")
        rows.extend(c.summary() for c in self.combine)
        return "\n".join(rows)

    def _matches(self, op: str | int) -> list[tuple[int, int]]:
        """(group index, position) of the nodes ``op`` names: an id, ``name#id`` or an op."""
        found = []
        for gi, g in enumerate(self.groups):
            ops = g.ops or tuple(f"?#{n}" for n in g.nodes)
            for k, (nid, name) in enumerate(zip(g.nodes, ops)):
                if op == nid or str(op) in (name, str(nid)) or name.split("#")[0] == op:
                    found.append((gi, k))
        return found

    def explain(self, op: str | int) -> str:
        """Why ``op`` was or was not fused, in a few lines: its kernel's time and deciding
        term, and the two best merges not made with their times and deciding terms.

        Parameters
        ----------
        op : str or int
            A node id, a stable name ``softmax#21``, or an op name (every node of it);
            ``"layout"``: the activation layout and why it was chosen; ``"combine"``:
            the decisions on parallel matmuls (Q/K/V) and why.
        """
        if op == "layout":
            return f"layout {self.layout}: {self.layout_reason or 'as stored with the plan'}"
        if op == "combine":
            if not self.combine:
                return "no parallel matmuls reading one input (nothing to combine)"
            return "\n".join(f"{c.summary()}; {c.reason}" for c in self.combine)
        combined = [c for c in self.combine if str(op) in c.ops]
        found = self._matches(op)
        if combined and not found:  # a sibling merged away into the combined matmul
            return "\n".join(f"{c.summary()}; {c.reason}" for c in combined)
        if not found:
            known = ", ".join([n for g in self.groups for n in g.ops][:4])
            raise PlanError(f"no operator {op!r} in this plan; give a node id, an op name "
                            f"or a stable name such as {known}")
        out = []
        for gi, k in found:
            g = self.groups[gi]
            me = g.ops[k] if g.ops else f"node {g.nodes[k]}"
            if len(g.nodes) > 1:
                out.append(f"{me} is fused in kernel {g.name} with "
                           f"{', '.join(o for o in g.ops if o != me)}: predicted "
                           f"{g.est_us:.2f} us fused against {g.unfused_us:.2f} us as "
                           f"{len(g.nodes)} kernels. {g.reason}")
            else:
                out.append(f"{me} runs alone in kernel {g.name} ({g.est_us:.2f} us). "
                           f"{g.reason}")
            near = [r for r in self.rejected if me in r.ops]
            # best first: the smallest predicted loss; rule rejections (no time) last
            near.sort(key=lambda r: (r.fused_us is None,
                                     0.0 if r.fused_us is None else r.fused_us - r.unfused_us))
            for r in near[:2]:
                if r.fused_us is None:
                    times = ""
                else:
                    times = (f"fused {r.fused_us:.2f} us vs unfused {r.unfused_us:.2f} us "
                             f"({r.fused_us - r.unfused_us:+.2f} us), decided by "
                             f"{r.decided_by}; ")
                out.append(f"  alternative: merge with {_brief(r.ops, me)}: {times}"
                           f"{_clip(r.reason)}")
            if len(near) > 2:
                out.append(f"  ({len(near) - 2} more merges not made: plan.rejected)")
        return "\n".join([*(f"{c.summary()}; {c.reason}" for c in combined), *out])

    def compare(self, other: "FusionPlan"):
        """Side by side with ``other`` (same graph): kernels only one of them has.

        Returns a :class:`~tvm_fusion.plan.PlanComparison`; it prints as text and
        renders as a table in a notebook (``tvm_fusion.explore.comparison_html``).
        """
        return PlanComparison.of(self, other)

    def differences(self, other: "FusionPlan") -> list[str]:
        """Kernels of this plan that ``other`` does not have, and how ``other`` splits them.

        Both plans must carry ``ops`` (plans from :func:`tvm_fusion.plan_fusion` do).
        """
        theirs = {frozenset(g.nodes): g for g in other.groups}
        where = other.group_of()
        lines = []
        for g in self.groups:
            if frozenset(g.nodes) in theirs:
                continue
            parts = sorted({where[n] for n in g.nodes if n in where})
            split = " + ".join("[" + ", ".join(other.groups[p].ops or map(str, other.groups[p].nodes))
                               + "]" for p in parts)
            lines.append(f"[{', '.join(g.ops)}] {g.est_us:.2f} us  <-  {other.planner}: "
                         f"{split} {sum(other.groups[p].est_us for p in parts):.2f} us")
        return lines


def _brief(ops, me: str, show: int = 3) -> str:
    """The other ops of a merge: all of a few, else the first ``show`` and a count."""
    others = [o for o in ops if o != me]
    if len(others) <= show + 1:
        return ", ".join(others)
    return f"{', '.join(others[:show])} and {len(others) - show} more ops"


def _clip(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
