"""Notebook views of fusion plans: the grouped graph drawn, tables, comparisons.

``plan_html`` and ``comparison_html`` are what Jupyter shows for a plan and for
``FusionPlan.compare`` (``tvm_fusion.explore`` registers them with IPython): the
operator graph with each kernel's operators in one colour (edges that stay on chip
drawn thick in that colour, edges through DRAM thin and grey), a table of kernels with
predicted time and DRAM bytes avoided, and every rejected merge with its reason and
numbers.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass

from .. import errors
from ..plan import plan_fusion
from ..plan.compare import kernel_ops as _ops
from ..targets import format_bytes

# matplotlib (about 1 s to import) is imported by the functions that draw, so that
# importing tvm_fusion.explore for its tables does not load it.

# A graph wider than this many layers wraps onto a new row of the drawing.
LAYERS_PER_ROW = 32
MAX_DRAWN_NODES = 600
LABELLED_NODES = 60


def _esc(x) -> str:
    return html.escape(str(x))


def _colours(plan) -> dict[int, str]:
    """Group index -> colour: fused groups cycle through tab10, single ops are grey."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    out, k = {}, 0
    for gi, g in enumerate(plan.groups):
        if len(g.nodes) > 1:
            r, gr, b, _ = cmap([0, 1, 2, 3, 4, 5, 6, 8, 9][k % 9])  # 7 is tab10's grey
            out[gi] = f"#{int(r * 255):02x}{int(gr * 255):02x}{int(b * 255):02x}"
            k += 1
        else:
            out[gi] = "#b8b8b8"
    return out


def layout(plan) -> dict[int, tuple[float, float]]:
    """Node id -> (x, y): x is the node's depth in the graph, wrapped into rows."""
    return {n: (x, y) for n, (x, y, _) in _layout(plan).items()}


def _layout(plan) -> dict[int, tuple[float, float, int]]:
    inputs: dict[int, list[int]] = {n: [] for g in plan.groups for n in g.nodes}
    users: dict[int, list[int]] = {n: [] for n in inputs}
    for a, b in plan.edges:
        inputs.setdefault(b, []).append(a)
        users.setdefault(a, []).append(b)
    depth: dict[int, int] = {}
    for n in sorted(inputs):  # node ids are topological
        depth[n] = 1 + max((depth[i] for i in inputs[n] if i in depth), default=-1)
    for n in sorted(inputs, reverse=True):
        # Ops fed only by model inputs (masks, position ids) sit just before their first
        # user, not at the far left with a long edge across the drawing.
        if not inputs[n] and users.get(n):
            depth[n] = max(0, min(depth[u] for u in users[n]) - 1)
    group_of = plan.group_of()
    taken: dict[int, set[int]] = {}
    lane_of: dict[int, int] = {}
    for n in sorted(depth, key=lambda n: (depth[n], n)):
        # Follow a producer's lane (one of the same kernel first) so chains stay straight.
        prefs = sorted(inputs[n], key=lambda i: group_of.get(i) != group_of.get(n))
        used = taken.setdefault(depth[n], set())
        lane = next((lane_of[i] for i in prefs if i in lane_of and lane_of[i] not in used),
                    None)
        if lane is None:
            lane = next(k for k in range(len(used) + 1) if k not in used)
        used.add(lane)
        lane_of[n] = lane
    row_height = 1 + max(lane_of.values(), default=0) + 1
    pos = {}
    for n in depth:
        row, col = divmod(depth[n], LAYERS_PER_ROW)
        pos[n] = (float(col), -float(row * row_height + lane_of[n]), row)
    return pos


def _figsize(pos: dict) -> tuple[float, float]:
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    return (min(18.0, 2.0 + 0.5 * (max(xs) - min(xs) + 1)),
            min(40.0, 1.5 + 0.45 * (max(ys) - min(ys) + 1)))


def draw_plan(plan, ax=None):
    """Draw ``plan``'s operator graph with its kernels as coloured clusters.

    Parameters
    ----------
    plan : FusionPlan
        A plan that carries the graph's edges (every plan made by
        :func:`tvm_fusion.plan_fusion` does).
    ax : matplotlib Axes, optional
        Where to draw; a new figure sized to the graph if omitted.

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyBboxPatch

    if not plan.edges and sum(len(g.nodes) for g in plan.groups) > 1:
        raise errors.PlanError("this plan carries no graph edges (it was written before "
                               "plans stored them); re-create it with plan_fusion")
    placed = _layout(plan)
    pos = {n: (x, y) for n, (x, y, _) in placed.items()}
    group_of = plan.group_of()
    colour = _colours(plan)
    if ax is None:
        fig, ax = plt.subplots(figsize=_figsize(pos))
    fig = ax.figure
    for gi, g in enumerate(plan.groups):
        if len(g.nodes) < 2:
            continue
        rows: dict[int, list[tuple[float, float]]] = {}
        for n in g.nodes:  # one box per row the group spans (a wrapped group has two)
            rows.setdefault(placed[n][2], []).append(pos[n])
        for pts in rows.values():
            x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
            y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
            ax.add_patch(FancyBboxPatch((x0 - 0.32, y0 - 0.32), x1 - x0 + 0.64, y1 - y0 + 0.64,
                                        boxstyle="round,pad=0.02,rounding_size=0.2",
                                        fc=colour[gi], ec=colour[gi], alpha=0.25, lw=1))
    for a, b in plan.edges:
        if a not in pos or b not in pos:
            continue
        same = group_of.get(a) == group_of.get(b)
        (xa, ya), (xb, yb) = pos[a], pos[b]
        style = dict(color=colour[group_of[a]] if same else "#9a9a9a",
                     lw=2.6 if same else 0.8, ls="-" if same else (0, (3, 2)),
                     alpha=1.0 if placed[a][2] == placed[b][2] else 0.3)
        if ya == yb and abs(xb - xa) > 1:  # a skip edge along a lane: arc over the lane
            ax.annotate("", (xb, yb), (xa, ya), zorder=1, arrowprops=dict(
                arrowstyle="-", connectionstyle="arc3,rad=-0.25", shrinkA=0, shrinkB=0,
                **style))
        else:
            ax.plot([xa, xb], [ya, yb], zorder=1, **style)
    labelled = len(pos) <= LABELLED_NODES
    for gi, g in enumerate(plan.groups):
        for k, n in enumerate(g.nodes):
            x, y = pos[n]
            ax.scatter([x], [y], s=70, color=colour[gi], edgecolor="#333333", lw=0.6, zorder=2)
            name = (g.ops[k] if g.ops else str(n)).split("#")[0]
            if labelled:
                ax.annotate(name, (x, y), xytext=(4, 5), textcoords="offset points",
                            fontsize=7, rotation=25)
            elif k == 0 and len(g.nodes) > 1:
                ax.annotate(f"k{gi}", (x, y), xytext=(3, 5), textcoords="offset points",
                            fontsize=7, color="#222222")
    ax.set_axis_off()
    ax.legend(handles=[
        Line2D([], [], color="#4c72b0", lw=2.6, label="edge kept on chip (inside a kernel)"),
        Line2D([], [], color="#9a9a9a", lw=0.8, ls=(0, (3, 2)), label="edge through DRAM"),
        Line2D([], [], marker="o", ls="", color="#b8b8b8", markeredgecolor="#333333",
               label="operator alone in its kernel")],
        loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=8, ncol=3, frameon=False)
    ax.set_title(f"{plan.target}: {len(plan.groups)} kernels from {len(pos)} operators "
                 f"({plan.planner} planner), predicted {plan.est_us:.1f} us", fontsize=10)
    fig.tight_layout()
    return fig


def plan_svg(plan) -> str | None:
    """The drawing as inline SVG; None where it cannot be drawn (say why in the caller)."""
    n = sum(len(g.nodes) for g in plan.groups)
    if n > MAX_DRAWN_NODES or (not plan.edges and n > 1):
        return None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    # A bare Figure, not pyplot's: no backend switch, and Jupyter's inline backend does
    # not show it a second time as a PNG.
    fig = Figure(figsize=_figsize(layout(plan)))
    draw_plan(plan, ax=fig.subplots())
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.find("<svg"):]


def _table(header: list[str], rows: list[list], align_right=()) -> str:
    th = "".join(f"<th style='text-align:left'>{_esc(h)}</th>" for h in header)
    body = []
    for r in rows:
        tds = []
        for i, c in enumerate(r):
            style = "text-align:right" if i in align_right else "text-align:left"
            cell = c if isinstance(c, _Raw) else _esc(c)
            tds.append(f"<td style='{style}'>{cell}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Raw(str):
    """A table cell that is already HTML."""


def _swatch(colour: str) -> _Raw:
    return _Raw(f"<span style='display:inline-block;width:0.9em;height:0.9em;"
                f"background:{colour};border:1px solid #555'></span>")


def plan_html(plan) -> str:
    """The notebook view of a plan: summary, drawing, kernels, rejected merges."""
    try:
        colour = _colours(plan)
    except ImportError:
        colour = {gi: "#b8b8b8" for gi in range(len(plan.groups))}
    kept = sum(g.kept_on_chip_bytes for g in plan.groups)
    n_ops = sum(len(g.nodes) for g in plan.groups)
    parts = [f"<div><b>FusionPlan</b> for <code>{_esc(plan.target)}</code> "
             f"({_esc(plan.planner)} planner): {len(plan.groups)} kernels from {n_ops} "
             f"operators, predicted {plan.est_us:.1f} us, {format_bytes(kept)} DRAM bytes avoided, "
             f"{len(plan.rejected)} merges rejected; hash <code>{plan.hash}</code></div>"]
    svg = plan_svg(plan)
    if svg is not None:
        parts.append(f"<div style='max-height:700px;overflow:auto'>{svg}</div>")
    else:
        parts.append(f"<div><i>graph not drawn ({n_ops} operators"
                     + (", no edges stored" if not plan.edges else "")
                     + "; use tvm_fusion.explore.draw_plan)</i></div>")
    rows = [[_swatch(colour[gi]), gi, g.name, ", ".join(g.ops or map(str, g.nodes)),
             f"{g.est_us:.2f}", f"{g.unfused_us:.2f}", format_bytes(g.kept_on_chip_bytes),
             g.decided_by, g.reason] for gi, g in enumerate(plan.groups)]
    parts.append("<details open><summary>kernels</summary>" + _table(
        ["", "#", "kernel", "operators", "predicted us", "unfused us", "DRAM bytes avoided",
         "decided by", "reason"], rows, align_right=(1, 4, 5, 6)) + "</details>")
    if plan.rejected:
        rows = [[", ".join(r.ops), "-" if r.fused_us is None else f"{r.fused_us:.2f}",
                 f"{r.unfused_us:.2f}", r.decided_by, r.reason] for r in plan.rejected]
        parts.append(f"<details><summary>{len(plan.rejected)} rejected merges</summary>"
                     + _table(["operators", "fused us", "unfused us", "decided by", "reason"],
                              rows, align_right=(1, 2)) + "</details>")
    built = [(gi, g) for gi, g in enumerate(plan.groups) if g.resources]
    if built:  # a GPU plan made with the compiler's numbers (tvm_fusion.gpu.resources)
        amd = str(built[0][1].resources.get("source", "")).startswith("gfx")
        regs, unit = ("VGPRs", "CU") if amd else ("registers", "SM")
        rows = [[_swatch(colour[gi]), gi, g.name, g.resources.get("predicted_registers", ""),
                 g.resources.get("registers", ""), g.resources.get("shared_bytes", ""),
                 g.resources.get("spill_bytes", ""), g.resources.get("kernels", ""),
                 g.resources.get("blocks_per_unit", ""),
                 f"{float(g.resources.get('occupancy', 0)):.0%}"]
                + ([g.resources.get("waves_per_simd", "")] if amd else [])
                for gi, g in built]
        parts.append(
            f"<details open><summary>kernel resources from the "
            f"{_esc(built[0][1].resources.get('source', 'compiler'))}</summary>" + _table(
                ["", "#", "kernel", f"estimated {regs}", regs, "shared / LDS B", "spill B",
                 "kernels", f"blocks per {unit}", "occupancy"]
                + (["waves per SIMD"] if amd else []), rows,
                align_right=tuple(range(1, 11)) if amd else tuple(range(1, 10)))
            + "</details>")
    if plan.notes:
        parts.append("<div>" + "<br>".join(_esc(n) for n in plan.notes) + "</div>")
    return "\n".join(parts)


def comparison_html(cmp) -> str:
    """A :class:`~tvm_fusion.plan.PlanComparison` as tables: both plans, then each kernel
    only the first has beside the kernels the second splits it into."""
    a, b = cmp.a, cmp.b
    name = cmp.plan_name
    head = _table(["plan", "kernels", "predicted us", "DRAM bytes avoided"],
                  [[name(p), len(p.groups), f"{p.est_us:.1f}",
                    format_bytes(sum(g.kept_on_chip_bytes for g in p.groups))]
                   for p in (a, b)], align_right=(1, 2, 3))
    if cmp.same:
        return head + "<div>same partition</div>"
    where = b.group_of()
    rows = []
    for g in cmp.only_a:
        parts = [b.groups[p] for p in sorted({where[n] for n in g.nodes if n in where})]
        rows.append([_ops(g), f"{g.est_us:.2f}", " + ".join(_ops(p) for p in parts),
                     f"{sum(p.est_us for p in parts):.2f}", g.decided_by])
    return head + _table([f"{name(a)} kernel", "us", f"{name(b)} kernels",
                          "us", f"decided by ({name(a)})"], rows,
                         align_right=(1, 3))


@dataclass(frozen=True, kw_only=True)
class TargetComparison:
    """The plans of one graph for several targets (from :func:`compare_targets`)."""

    plans: dict

    def kernel_of(self) -> dict[str, dict[int, int]]:
        """Target -> node id -> index of its kernel in that target's plan."""
        return {t: p.group_of() for t, p in self.plans.items()}

    def differing_nodes(self) -> list[int]:
        """Node ids whose kernel-mates are not the same on every target."""
        mates = {t: {n: frozenset(p.groups[gi].nodes) for n, gi in p.group_of().items()}
                 for t, p in self.plans.items()}
        nodes = sorted(next(iter(mates.values()))) if mates else []
        return [n for n in nodes if len({m[n] for m in mates.values()}) > 1]

    def __str__(self) -> str:
        lines = [f"{t}: {len(p.groups)} kernels, {p.est_us:.1f} us predicted"
                 for t, p in self.plans.items()]
        lines.append(f"{len(self.differing_nodes())} operators are grouped differently")
        return "\n".join(lines)

    def _repr_html_(self, all_nodes: bool = False) -> str:
        plans = list(self.plans.items())
        head = _table(["target", "kernels", "predicted us", "DRAM bytes avoided", "rejected merges"],
                      [[t, len(p.groups), f"{p.est_us:.1f}",
                        format_bytes(sum(g.kept_on_chip_bytes for g in p.groups)),
                        len(p.rejected)] for t, p in plans], align_right=(1, 2, 3, 4))
        nodes = self.differing_nodes()
        if not nodes:
            return head + "<div>every target groups the operators the same way</div>"
        first = plans[0][1]
        names = {n: op for g in first.groups for n, op in zip(g.nodes, g.ops or ())}
        colours = {t: _colours(p) for t, p in plans}
        kernel_of = self.kernel_of()
        rows = []
        for n in nodes:
            row = [names.get(n, str(n))]
            for t, p in plans:
                gi = kernel_of[t][n]
                g = p.groups[gi]
                mates = len(g.nodes) - 1
                row.append(_Raw(f"{_swatch(colours[t][gi])} k{gi} "
                                + _esc(f"({mates} other op{'s' * (mates != 1)})"
                                       if mates else "(alone)")))
            rows.append(row)
        return (head + f"<div>{len(nodes)} operators grouped differently; cell = the "
                "operator's kernel on that target</div>"
                + _table(["operator"] + [t for t, _ in plans], rows))


def compare_targets(graph, targets=("x86_avx2", "a100", "mi250x"), *,
                    planner: str = "cost") -> TargetComparison:
    """Plan ``graph`` for each target and put the plans side by side.

    Parameters
    ----------
    graph : OpGraph
        From :func:`tvm_fusion.build_graph`.
    targets : sequence of str
        Target names (``tvm-fusion targets`` lists them).
    planner : str
        As in :func:`tvm_fusion.plan_fusion`.
    """
    return TargetComparison(plans={t: plan_fusion(graph, t, planner=planner) for t in targets})
