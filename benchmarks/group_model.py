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
A last line is JSON with the same numbers. ``-o FILE`` also trains one model on all
records and writes it (xgboost JSON/UBJ plus ``FILE.meta.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

from benchmarks.planner_accuracy import spearman


def records_of(dirs: list[Path]) -> list:
    """Every tuned kernel of the (target directories under) ``dirs``."""
    from tvm_fusion.costmodel.group_data import kernel_records, target_dirs
    from tvm_fusion.costmodel.group_model import MIN_TRIALS_PER_KERNEL

    return [r for d in dirs for t in target_dirs(d)
            for r in kernel_records(t, min_trials_per_kernel=MIN_TRIALS_PER_KERNEL)]


def _scores(pred, meas) -> dict:
    err = [max(p / m, m / p) for p, m in zip(pred, meas)]
    return {"spearman": round(spearman(pred, meas), 4),
            "median_error": round(statistics.median(err), 4)}


def leave_one_model_out(records: list, *, rounds: int | None = None) -> list[dict]:
    """One row per model: its kernels' scores, analytical vs learned held out."""
    from tvm_fusion.costmodel.group_model import (
        ROUNDS, feature_matrix, group_features, train_group_model)

    rows = []
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
                         "learned": _scores(learned, meas)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", required=True, type=Path, nargs="+",
                    help="tuning-log target directories, or directories of them")
    ap.add_argument("-o", "--output", type=Path,
                    help="also train on every record and write the model here (.json/.ubj)")
    ap.add_argument("--rounds", type=int, help="boosting rounds (default: the model's)")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.logs if not d.is_dir()]
    if missing:
        print(f"error: --logs {' '.join(missing)}: not a directory; pass tuning-log "
              "directories written by `tvm-fusion tune`", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    from tvm_fusion.costmodel.group_model import MIN_TRIALS_PER_KERNEL

    records = records_of(args.logs)
    models = sorted({r.model for r in records})
    print(f"# {len(records)} tuned kernels of {len(models)} models: {', '.join(models)} "
          f"(models of logs with fewer than {MIN_TRIALS_PER_KERNEL:g} trials per kernel "
          "left out)")
    rows = leave_one_model_out(records, rounds=args.rounds)
    print(f"{'held-out model':<18} {'target':<9} {'kernels':>7} {'train':>5} {'thin':>4} "
          f"{'analytical rho':>14} {'err':>6} {'learned rho':>11} {'err':>6}")
    for r in rows:
        a, lr = r["analytical"], r["learned"]
        print(f"{r['model']:<18} {r['target']:<9} {r['kernels']:>7} {r['train']:>5} {r['thin']:>4} "
              f"{a['spearman']:>14.3f} {a['median_error']:>6.2f} "
              f"{lr['spearman']:>11.3f} {lr['median_error']:>6.2f}")
    if args.output:
        from tvm_fusion.costmodel.group_model import ROUNDS, train_group_model

        path = train_group_model(records, rounds=args.rounds or ROUNDS).save(args.output)
        print(f"# model trained on all {len(records)} kernels written to {path}")
    print(json.dumps({"records": len(records), "per_model": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
