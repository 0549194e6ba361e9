"""Notebook views of a learned cost model: its metrics, and predicted against measured."""

from __future__ import annotations

import numpy as np

from ..costmodel.model import METRICS_DEFINITION, rank_correlation, ranks_in_unit
from .plan_view import _esc, _table

# matplotlib (about 1 s to import) is imported by the functions that draw, so that
# importing tvm_fusion.explore for its tables does not load it.


def plot_predicted_vs_measured(model, data, ax=None, *, title: str = ""):
    """Each candidate at (predicted rank, measured speed) within its workload.

    x: the candidate's rank among its workload's candidates by the model's score (1 =
    predicted fastest); y: its measured throughput relative to the workload's best
    (1 = the fastest measured). A perfect ranker puts the points on the diagonal. The
    title gives Spearman's rank correlation (mean over workloads) and the pairwise
    accuracy.

    Parameters
    ----------
    model : tvm_fusion.costmodel.RankModel
    data : tvm_fusion.costmodel.Dataset
        Preferably workloads held out from the model's training.
    """
    import matplotlib.pyplot as plt

    scores = model.predict(data)
    lat, wl = data.latency_s, data.workload
    xs, ys = [], []
    for key in np.unique(wl):
        m = wl == key
        if m.sum() < 2:
            continue
        xs.extend(ranks_in_unit(scores[m]).tolist())
        ys.extend((lat[m].min() / lat[m]).tolist())
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 4.5))
    ax.scatter(xs, ys, s=14, alpha=0.5, color="#4c72b0", edgecolor="none")
    ax.plot([0, 1], [0, 1], color="#888", ls="--", lw=1)
    metrics = model.evaluate(data)
    rho = rank_correlation(scores, lat, wl)
    ax.set_xlabel("predicted rank within workload (0 = slowest, 1 = fastest)")
    ax.set_ylabel("measured throughput / best of workload")
    ax.set_title((title + "\n" if title else "") + f"Spearman rho {rho:.3f}, pairwise "
                 f"accuracy {metrics['pairwise_accuracy']:.3f},\ntop-1 peak "
                 f"{metrics['top1']:.3f} over {len(np.unique(wl))} workloads", fontsize=9)
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.figure.tight_layout()
    return ax.figure


def cost_model_html(model) -> str:
    """A cost model's sidecar as tables: data, and metrics per split."""
    meta = model.meta
    data = meta.get("data", {})
    head = (f"<div><b>Cost model</b> ({_esc(meta.get('objective', '?'))}), feature version "
            f"{_esc(meta.get('feature_version'))}, {_esc(meta.get('features'))} features, "
            f"{_esc(meta.get('rounds'))} rounds; targets {_esc(', '.join(meta.get('targets', [])))}"
            f"; trained on {_esc(data.get('candidates'))} candidates of "
            f"{_esc(data.get('workloads'))} workloads, {_esc(data.get('holdout_workloads', 0))}"
            " workloads held out</div>")
    rows = []
    for split, m in meta.get("metrics", {}).items():
        tenset = m.get("definition") == METRICS_DEFINITION
        rows.append([split, f"{m['pairwise_accuracy']:.4f}" if tenset else "-",
                     f"{m['pooled_pairwise_accuracy' if tenset else 'pairwise_accuracy']:.4f}",
                     m["pairs"], f"{m['top1']:.4f}",
                     f"{m['top5']:.4f}" if tenset else f"{m['top5']:.4f} (best of 5)",
                     m.get("workloads", m.get("top1_workloads"))])
    return head + _table(["split", "pairwise accuracy (TenSet)", "pooled pairwise", "pairs",
                          "top-1 peak", "top-5 peak", "workloads"], rows,
                         align_right=(1, 2, 3, 4, 5, 6))
