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

``--loo`` holds each model out in turn: the CPU compute term's shares
(:mod:`tvm_fusion.plan.cpu_efficiency`) are fitted on the measured kernels of every
*other* model (:func:`tvm_fusion.costmodel.efficiency_fit.fit_cpu_efficiency`) and the
held-out model's kernels are predicted with them, so no kernel's own time enters its
prediction. The tables then give, per op class (:func:`op_class`: the kernel's main
operator) and per held-out model, the median and 90th-percentile error and Spearman,
and per model whether the goal holds: median <= 1.3x, Spearman >= 0.9, and every kernel
with over 10% of the model's measured time within 2x. Models are named by their log
directory when a directory of per-model log directories is given
(``DIR/<model>/<target>/manifest.json``).
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


def op_class(cost_model, nodes) -> str:
    """The class of a kernel by its main operator (:func:`tvm_fusion.plan.cost.op_class`)."""
    from tvm_fusion.plan.cost import op_class as by_main_op

    return by_main_op(cost_model.graph, cost_model.infos, nodes)


def _row(rec, pred: float, name: str | None = None) -> dict:
    cost = rec.cost_model.group_cost(rec.nodes)
    meas = rec.meas_us
    return {"model": name or rec.model, "target": rec.cost_model.hw.name,
            "kernel": rec.kernel, "ops": len(rec.nodes), "pred_us": pred,
            "meas_us": meas, "ratio": max(pred / meas, meas / pred),
            "bound": cost.bound, "class": op_class(rec.cost_model, rec.nodes)}


def kernel_rows(tdir: Path, models: list[str] | None = None) -> list[dict]:
    """One row per measured kernel of every (selected) model in target dir ``tdir``
    (the matching is :func:`tvm_fusion.costmodel.group_data.kernel_records`)."""
    from tvm_fusion.costmodel.group_data import kernel_records

    return [_row(rec, rec.analytical_us) for rec in kernel_records(tdir, models)]


def _log_name(tdir: Path, root: Path) -> str | None:
    """The model's name from ``root/<model>/<target>/``, else None."""
    rel = Path(tdir).resolve().relative_to(Path(root).resolve()).parts
    return rel[0] if len(rel) == 2 else None


def loo_rows(dirs: list[Path], root: Path, models: list[str] | None = None) -> list[dict]:
    """Rows as :func:`kernel_rows`, each CPU model predicted with the compute shares
    fitted on the other models' kernels (``fitted_*`` keys carry those shares)."""
    import dataclasses

    import numpy as np

    from tvm_fusion.costmodel.efficiency_fit import (
        efficiency_terms, fit_cpu_efficiency, with_cpu_efficiency)
    from tvm_fusion.costmodel.group_data import kernel_records, kernel_us
    from tvm_fusion.plan import AnalyticalCostModel

    recs, names = [], []
    for d in dirs:
        for rec in kernel_records(d, models):
            recs.append(rec)
            names.append(_log_name(d, root) or rec.model)
    cpu = [k for k, r in enumerate(recs) if r.cost_model.hw.family == "cpu"]
    terms = efficiency_terms([recs[k] for k in cpu])
    model_of = np.array([names[k] for k in cpu])
    rows = [_row(r, r.analytical_us, n) for k, (r, n) in enumerate(zip(recs, names))
            if r.cost_model.hw.family != "cpu"]
    for held in dict.fromkeys(model_of):
        train = model_of != held
        if not train.any():
            continue
        sub = dataclasses.replace(terms, **{f.name: getattr(terms, f.name)[train]
                                           for f in dataclasses.fields(terms)})
        eff = fit_cpu_efficiency(sub, source=f"fitted without {held}")
        priced = {}
        for k in np.flatnonzero(~train):
            rec = recs[cpu[k]]
            cm = rec.cost_model
            if id(cm) not in priced:
                priced[id(cm)] = AnalyticalCostModel(
                    cm.graph, with_cpu_efficiency(cm.hw, eff), cm.infos)
            pred = kernel_us(priced[id(cm)].group_cost(rec.nodes).total_us, cm.hw)
            rows.append({**_row(rec, pred, held),
                         **{f"fitted_{s}": v for s, v in eff.to_json().items()}})
    return rows


def _quantile(values, q: float) -> float:
    import numpy as np

    return float(np.quantile(np.asarray(values, dtype=float), q)) if values else float("nan")


def class_table(rows: list[dict]) -> list[dict]:
    """Per op class: kernels, median and p90 error, Spearman."""
    from tvm_fusion.plan.cost import OP_CLASSES

    out = []
    for cls in OP_CLASSES:
        sub = [r for r in rows if r["class"] == cls]
        if sub:
            out.append({"class": cls, "kernels": len(sub),
                        "median_error": round(statistics.median(r["ratio"] for r in sub), 3),
                        "p90_error": round(_quantile([r["ratio"] for r in sub], 0.9), 3),
                        "spearman": round(spearman([r["pred_us"] for r in sub],
                                                   [r["meas_us"] for r in sub]), 3)})
    return out


def goal(rows: list[dict]) -> dict:
    """The issue's goal on one held-out model's rows: median <= 1.3x, Spearman >= 0.9,
    every kernel over 10% of the model's measured time within 2x."""
    s = summary(rows)
    total = sum(r["meas_us"] for r in rows)
    big = [r for r in rows if r["meas_us"] > 0.1 * total]
    worst_big = max((r["ratio"] for r in big), default=1.0)
    ok = (s["median_error"] is not None and s["median_error"] <= 1.3
          and s["spearman"] is not None and s["spearman"] >= 0.9 and worst_big <= 2.0)
    return {**s, "p90_error": round(_quantile([r["ratio"] for r in rows], 0.9), 3),
            "big_kernels": len(big), "worst_big_error": round(worst_big, 3), "goal": ok}


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
    ap.add_argument("--loo", action="store_true",
                    help="leave one model out: price each model with the CPU compute "
                         "shares fitted on the others, and print per-class tables")
    ap.add_argument("-o", "--output", type=Path, help="also write the rows and tables as JSON")
    args = ap.parse_args(argv)
    from functools import partial

    from tvm_fusion.logs.tools import target_dirs

    target_dirs = partial(target_dirs, manifest_only=True, missing_ok=True)
    dirs = target_dirs(args.logs) if args.logs.is_dir() else []
    if args.logs.is_dir() and not dirs:  # a directory of per-model log directories
        dirs = [t for d in sorted(args.logs.iterdir()) if d.is_dir() for t in target_dirs(d)]
    if not dirs:
        print(f"error: --logs {args.logs}: no manifest.json in it or in its subdirectories; "
              "pass a tuning-log directory written by `tvm-fusion tune`", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    if args.loo:
        rows = loo_rows(dirs, args.logs, args.model)
    else:
        rows = [r for d in dirs for r in kernel_rows(d, args.model)]
    print(f"{'model':<18} {'target':<9} {'ops':>3} {'pred_us':>10} {'meas_us':>10} "
          f"{'ratio':>6} bound    {'class':<18} kernel")
    for r in rows:
        print(f"{r['model']:<18} {r['target']:<9} {r['ops']:>3} {r['pred_us']:>10.2f} "
              f"{r['meas_us']:>10.2f} {r['ratio']:>6.2f} {r['bound']:<8} "
              f"{r['class']:<18} {r['kernel'][:50]}")
    models = dict.fromkeys(r["model"] for r in rows)
    per_model = {m: goal([r for r in rows if r["model"] == m]) for m in models}
    classes = class_table(rows)
    if args.loo:
        print(f"\n{'class':<20} {'kernels':>7} {'median':>7} {'p90':>7} {'spearman':>8}")
        for c in classes:
            print(f"{c['class']:<20} {c['kernels']:>7} {c['median_error']:>7.2f} "
                  f"{c['p90_error']:>7.2f} {c['spearman']:>8.3f}")
        print(f"\n{'held-out model':<20} {'kernels':>7} {'median':>7} {'p90':>7} "
              f"{'spearman':>8} {'big':>4} {'worst big':>9} goal")
        for m, g in per_model.items():
            print(f"{m:<20} {g['kernels']:>7} {g['median_error']:>7.2f} {g['p90_error']:>7.2f} "
                  f"{g['spearman']:>8.3f} {g['big_kernels']:>4} {g['worst_big_error']:>9.2f} "
                  f"{'yes' if g['goal'] else 'no'}")
    result = {**summary(rows), "per_model": per_model, "per_class": classes}
    if args.output:
        args.output.write_text(json.dumps({**result, "rows": rows}, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
