"""``python -m benchmarks.group_model --logs DIR... [-o FILE]``: the learned group-latency
model, evaluated leave-one-model-out against the analytical model.

Every measured kernel of the log directories (each a tuning-log target directory or a
directory of them; :func:`tvm_fusion.costmodel.group_data.kernel_records`) tuned with at
least ``MIN_TRIALS_PER_KERNEL`` trials per kernel is a record.
For each model, a group model is trained on the records of every other model and
predicts the held-out model's kernels; the table prints, per held-out model and target
(``train``: the training records of that target's hardware), the
Spearman rank correlation and the median error (median of max(pred/meas, meas/pred),
as ``benchmarks/planner_accuracy.py``) of the analytical and the learned times. A
held-out kernel whose target the training data lacks, or whose size lies outside the
training range, keeps its analytical time (as the planner would), counted in ``thin``.

The CPU compute term's efficiencies (:mod:`tvm_fusion.plan.cpu_efficiency`) get their
own columns on the CPU records: ``peak`` is the analytical model pricing FLOPs at the
unit's peak (every share 1: the model before the efficiency term), ``default`` the
model with the shipped default shares (fitted on this project's records, so on them an
in-sample score, not a held-out one), ``fitted`` the shares fitted by
:func:`~tvm_fusion.costmodel.efficiency_fit.fit_cpu_efficiency` on every *other*
model's CPU records (the held-out model's never enter its fit). ``analytical`` and
``learned`` are as the planner prices by default (the default shares included).
A last line is JSON with the same numbers. ``-o FILE`` also trains one model on all
records and writes it (xgboost JSON/UBJ plus ``FILE.meta.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

from benchmarks.planner_accuracy import spearman


def records_of(dirs: list[Path], reprice: dict | None = None) -> list:
    """Every tuned kernel of the (target directories under) ``dirs``; the kernels of a
    target named in ``reprice`` (name -> HardwareTarget) priced on that description."""
    from tvm_fusion.costmodel.group_data import kernel_records
    from tvm_fusion.logs.tools import target_dirs
    from tvm_fusion.costmodel.group_model import MIN_TRIALS_PER_KERNEL
    from tvm_fusion.plan import AnalyticalCostModel

    out = []
    for r in (r for d in dirs for t in target_dirs(d, manifest_only=True, missing_ok=True)
              for r in kernel_records(t, min_trials_per_kernel=MIN_TRIALS_PER_KERNEL)):
        hw = (reprice or {}).get(r.cost_model.hw.name)
        if hw is not None:
            r = dataclasses.replace(r, cost_model=AnalyticalCostModel(
                r.cost_model.graph, hw, r.cost_model.infos))
        out.append(r)
    return out


def _scores(pred, meas) -> dict:
    err = [max(p / m, m / p) for p, m in zip(pred, meas)]
    return {"spearman": round(spearman(pred, meas), 4),
            "median_error": round(statistics.median(err), 4)}


def leave_one_model_out(records: list, *, rounds: int | None = None) -> list[dict]:
    """One row per model: its kernels' scores, analytical vs learned held out."""
    from tvm_fusion.costmodel.group_model import (
        ROUNDS, feature_matrix, group_features, train_group_model)

    rows = []
    eff_rows = efficiency_columns(records)
    for model in dict.fromkeys(r.model for r in records):
        held = [r for r in records if r.model == model]
        train = [r for r in records if r.model != model]
        if not train:
            continue
        gm = train_group_model(train, rounds=rounds or ROUNDS)
        for target in dict.fromkeys(r.cost_model.hw.name for r in held):
            test = [r for r in held if r.cost_model.hw.name == target]
            ratio = np.exp(gm.log_ratio(feature_matrix(test)))
            analytical = [r.analytical_us for r in test]
            learned, thin = [], 0
            for r, a, k in zip(test, analytical, ratio):
                why = gm.thin(r.cost_model.hw, group_features(r.cost_model, r.nodes))
                thin += why is not None
                learned.append(a if why else a * float(k))
            meas = [r.meas_us for r in test]
            rows.append({"model": model, "target": target, "kernels": len(test),
                         "train": gm.records_for(test[0].cost_model.hw), "thin": thin,
                         "analytical": _scores(analytical, meas),
                         "learned": _scores(learned, meas),
                         **eff_rows.get((model, target), {})})
    return rows


def efficiency_columns(records: list) -> dict:
    """(model, target) -> scores of the ``peak``, ``default`` and ``fitted`` (leave that
    model out) compute terms, and the shares fitted without it, for CPU records."""
    from tvm_fusion.costmodel.efficiency_fit import efficiency_terms, fit_cpu_efficiency
    from tvm_fusion.plan.cpu_efficiency import DEFAULT_CPU_EFFICIENCY, CpuEfficiency

    cpu = [r for r in records if r.cost_model.hw.family == "cpu"]
    if not cpu:
        return {}
    terms = efficiency_terms(cpu)
    models = np.array([r.model for r in cpu])
    targets = np.array([r.cost_model.hw.name for r in cpu])
    ones = CpuEfficiency(gemm=1, depthwise=1, vector=1, accumulators=1)
    peak = efficiency_terms(cpu, accumulators=1).predict(ones)
    default = terms.predict(DEFAULT_CPU_EFFICIENCY)
    out = {}
    for model in dict.fromkeys(models):
        train = models != model
        if not train.any():
            continue
        sub = lambda mask: dataclasses.replace(terms, **{  # noqa: E731
            f.name: getattr(terms, f.name)[mask] for f in dataclasses.fields(terms)})
        eff = fit_cpu_efficiency(sub(train))
        fitted = terms.predict(eff)
        for target in dict.fromkeys(targets[~train]):
            test = (models == model) & (targets == target)
            meas = terms.meas[test]
            out[(model, target)] = {
                "peak": _scores(peak[test], meas), "default": _scores(default[test], meas),
                "fitted": _scores(fitted[test], meas), "fitted_shares": eff.to_json()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", required=True, type=Path, nargs="+",
                    help="tuning-log target directories, or directories of them")
    ap.add_argument("-o", "--output", type=Path,
                    help="also train on every record and write the model here (.json/.ubj)")
    ap.add_argument("--rounds", type=int, help="boosting rounds (default: the model's)")
    ap.add_argument("--reprice", action="append", default=[], metavar="TARGET=FILE.json",
                    help="price the kernels of logs of TARGET on this description instead "
                         "(e.g. host=FILE from `tvm-fusion calibrate`)")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.logs if not d.is_dir()]
    if missing:
        print(f"error: --logs {' '.join(missing)}: not a directory; pass tuning-log "
              "directories written by `tvm-fusion tune`", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    from tvm_fusion.costmodel.group_model import MIN_TRIALS_PER_KERNEL

    from tvm_fusion.targets import load_target

    reprice = {}
    for item in args.reprice:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            print(f"error: --reprice {item}: expected TARGET=FILE.json with an existing "
                  "target file, e.g. --reprice host=host_cal.json", file=sys.stderr)
            return 2
        reprice[name] = load_target(path)
    records = records_of(args.logs, reprice)
    models = sorted({r.model for r in records})
    print(f"# {len(records)} tuned kernels of {len(models)} models: {', '.join(models)} "
          f"(models of logs with fewer than {MIN_TRIALS_PER_KERNEL:g} trials per kernel "
          "left out)")
    rows = leave_one_model_out(records, rounds=args.rounds)
    cols = ("peak", "default", "fitted", "analytical", "learned")
    print(f"{'held-out model':<18} {'target':<9} {'kernels':>7} {'train':>5} {'thin':>4} "
          + " ".join(f"{c + ' rho':>14} {'err':>6}" for c in cols))
    for r in rows:
        cells = " ".join(f"{r[c]['spearman']:>14.3f} {r[c]['median_error']:>6.2f}"
                         if c in r else f"{'-':>14} {'-':>6}" for c in cols)
        print(f"{r['model']:<18} {r['target']:<9} {r['kernels']:>7} {r['train']:>5} "
              f"{r['thin']:>4} {cells}")
    if args.output:
        from tvm_fusion.costmodel.group_model import ROUNDS, train_group_model

        path = train_group_model(records, rounds=args.rounds or ROUNDS).save(args.output)
        print(f"# model trained on all {len(records)} kernels written to {path}")
    print(json.dumps({"records": len(records), "per_model": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
