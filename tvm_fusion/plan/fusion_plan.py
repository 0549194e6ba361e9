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
    """

    nodes: tuple[int, ...]
    name: str
    est_us: float = 0.0
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class FusionPlan:
    """A complete partition of a graph's operators into kernels."""

    target: str
    graph_signature: str
    planner: str
    groups: tuple[FusedGroup, ...]
    notes: tuple[str, ...] = field(default=())

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
        """Map node id to the index of its group."""
        return {n: gi for gi, g in enumerate(self.groups) for n in g.nodes}

    def to_json(self) -> dict:
        """The plan as a JSON-ready dict with its schema, version and hash."""
        d = asdict(self)
        d["groups"] = [asdict(g) for g in self.groups]
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
                                  reason=g.get("reason", "")) for g in d["groups"])
        plan = cls(target=d["target"], graph_signature=d["graph_signature"],
                   planner=d["planner"], groups=groups, notes=tuple(d.get("notes", ())))
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
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise PlanError(f"cannot read fusion plan {path}: {e}") from e

    def summary(self) -> str:
        """A text table: one row per kernel with its operators and predicted time."""
        rows = [f"{'#':>3}  {'est us':>9}  {'ops':>3}  kernel / operators"]
        for i, g in enumerate(self.groups):
            rows.append(f"{i:>3}  {g.est_us:>9.2f}  {len(g.nodes):>3}  {g.name}")
            if g.reason:
                rows.append(f"{'':>22}{g.reason}")
        rows.append(f"{len(self.groups)} kernels, predicted {self.est_us:.1f} us on "
                    f"{self.target} (planner: {self.planner})")
        return "\n".join(rows)
