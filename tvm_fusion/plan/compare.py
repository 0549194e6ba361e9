"""Two plans of one graph compared: the kernels only one of them has.

The data and its text live here, with the plan; the notebook's tables are drawn by
``tvm_fusion.explore.plan_view.comparison_html``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError


def kernel_ops(g) -> str:
    """A kernel's operators as ``[op, op, ...]`` (its node ids where the plan has no names)."""
    return "[" + ", ".join(g.ops or map(str, g.nodes)) + "]"


@dataclass(frozen=True, kw_only=True)
class PlanComparison:
    """Two plans of one graph side by side (from :meth:`FusionPlan.compare`).

    Prints as text; ``tvm_fusion.explore.comparison_html`` draws it as tables (what a
    notebook shows).

    Attributes
    ----------
    a, b : FusionPlan
    only_a, only_b : tuple of FusedGroup
        Kernels one plan has and the other splits or merges differently.
    """

    a: object
    b: object
    only_a: tuple
    only_b: tuple

    @classmethod
    def of(cls, a, b) -> "PlanComparison":
        if a.graph_signature != b.graph_signature:
            raise PlanError(
                f"the plans are for different graphs ({a.graph_signature} vs "
                f"{b.graph_signature}): compare plans of the same model and input shapes")
        sa, sb = ({frozenset(g.nodes) for g in p.groups} for p in (a, b))
        return cls(a=a, b=b, only_a=tuple(g for g in a.groups if frozenset(g.nodes) not in sb),
                   only_b=tuple(g for g in b.groups if frozenset(g.nodes) not in sa))

    @staticmethod
    def plan_name(p) -> str:
        """``target/planner``, how the comparison names a plan."""
        return f"{p.target}/{p.planner}"

    @property
    def same(self) -> bool:
        return not self.only_a and not self.only_b

    def __str__(self) -> str:
        a, b = self.a, self.b
        lines = [f"{self.plan_name(a)}: {len(a.groups)} kernels, {a.est_us:.1f} us predicted; "
                 f"{self.plan_name(b)}: {len(b.groups)} kernels, {b.est_us:.1f} us predicted"]
        if self.same:
            return lines[0] + "\nsame partition"
        where = b.group_of()
        for g in self.only_a:
            parts = sorted({where[n] for n in g.nodes if n in where})
            theirs = " + ".join(kernel_ops(b.groups[p]) for p in parts)
            lines.append(f"{self.plan_name(a)} {kernel_ops(g)} {g.est_us:.2f} us  <->  "
                         f"{self.plan_name(b)} {theirs}")
        return "\n".join(lines)
