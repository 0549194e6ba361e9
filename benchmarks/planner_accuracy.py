"""``python -m benchmarks.planner_accuracy --logs DIR [--model M]``: how well the
planner's analytical model predicts the tuned kernels it plans.

For every model a tuning-log directory holds (``DIR`` is a target directory with a
``manifest.json``, or a directory of them), the model is re-imported with its recorded
input shapes, the plan stored with the logs is read back, and each kernel of the plan
that has a measured record is printed with

- ``pred_us``: the cost model's ``total_us`` of the group on the logs' target
  (``hw_targets/<target>.json``), less the Relax VM's call of the kernel on CPUs
  (``call_overhead_us``, else ``CPU_CALL_US``), which the runner does not pay; fork-joins
  and GPU launches stay in (the runner's timings include them);
- ``meas_us``: the mean run time of the best measured record of its workload (what
  MetaSchedule's runner measured: the kernel alone, no VM call);
- ``ratio``: ``max(pred / meas, meas / pred)``.

A last line is JSON: ``spearman`` (rank correlation of predicted and measured over the
kernels), ``median_error`` (the median ratio), ``kernels``, and the same per model. The
issue's goal on x86: Spearman >= 0.9 and median error <= 1.3.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their mean rank
            idx = x == v
            r[idx] = r[idx].mean()
        return r
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def kernel_rows(tdir: Path, models: list[str] | None = None) -> list[dict]:
    """One row per measured kernel of every (selected) model in target dir ``tdir``
    (the matching is :func:`tvm_fusion.costmodel.group_data.kernel_records`)."""
    from tvm_fusion.costmodel.group_data import kernel_records

    rows = []
    for rec in kernel_records(tdir, models):
        cost = rec.cost_model.group_cost(rec.nodes)
        pred, meas = rec.analytical_us, rec.meas_us
        rows.append({"model": rec.model, "target": rec.cost_model.hw.name,
                     "kernel": rec.kernel, "ops": len(rec.nodes), "pred_us": pred,
                     "meas_us": meas, "ratio": max(pred / meas, meas / pred),
                     "bound": cost.bound})
    return rows


def summary(rows: list[dict]) -> dict:
    """``spearman``, ``median_error`` and ``kernels`` of ``rows``."""
    if not rows:
        return {"spearman": None, "median_error": None, "kernels": 0}
    return {"spearman": round(spearman([r["pred_us"] for r in rows],
                                       [r["meas_us"] for r in rows]), 4),
            "median_error": round(statistics.median(r["ratio"] for r in rows), 4),
            "kernels": len(rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", required=True, type=Path,
                    help="a tuning-log target directory, or a directory of them")
    ap.add_argument("--model", action="append",
                    help="only this model (its source name: embedded, minilm-l3, ...)")
    args = ap.parse_args(argv)
    from tvm_fusion.costmodel.group_data import target_dirs

    dirs = target_dirs(args.logs) if args.logs.is_dir() else []
    if not dirs:
        print(f"error: --logs {args.logs}: no manifest.json in it or in its subdirectories; "
              "pass a tuning-log directory written by `tvm-fusion tune`", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    rows = [r for d in dirs for r in kernel_rows(d, args.model)]
    print(f"{'model':<18} {'target':<9} {'ops':>3} {'pred_us':>10} {'meas_us':>10} "
          f"{'ratio':>6} bound    kernel")
    for r in rows:
        print(f"{r['model']:<18} {r['target']:<9} {r['ops']:>3} {r['pred_us']:>10.2f} "
              f"{r['meas_us']:>10.2f} {r['ratio']:>6.2f} {r['bound']:<8} {r['kernel'][:60]}")
    per_model = {m: summary([r for r in rows if r["model"] == m])
                 for m in dict.fromkeys(r["model"] for r in rows)}
    print(json.dumps({**summary(rows), "per_model": per_model}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
