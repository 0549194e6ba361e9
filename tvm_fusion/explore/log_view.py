"""Notebook view of a tuning log directory: per target, models, workloads, best times."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..logs.tools import format_show, show
from .plan_view import _esc, _table


@dataclass(frozen=True, kw_only=True)
class LogView:
    """What ``tvm-fusion logs show`` reports, as an object that renders in a notebook.

    Attributes
    ----------
    path : Path
        The log directory.
    targets : tuple of dict
        One entry per target directory (:func:`tvm_fusion.logs.tools.show`'s output).
    """

    path: Path
    targets: tuple

    def __str__(self) -> str:
        return format_show(list(self.targets))

    def best_us(self) -> dict[str, dict[str, float]]:
        """Target name -> kernel name -> best verified latency in microseconds."""
        out: dict[str, dict[str, float]] = {}
        for t in self.targets:
            name = (t.get("target") or {}).get("name", Path(t["target_dir"]).name)
            for w in t["workloads"]:
                for user in w["used_by"] or [{"kernel": w["workload"]}]:
                    if w["best_us"] is not None:
                        out.setdefault(name, {})[user["kernel"]] = w["best_us"]
        return out

    def _repr_html_(self) -> str:
        parts = []
        for t in self.targets:
            tgt = t.get("target") or {}
            v = t["versions"]
            parts.append(f"<div><b>{_esc(tgt.get('name', t['target_dir']))}</b> "
                         f"<code>{_esc(t['target_dir'])}</code>: {len(t['workloads'])} "
                         f"workloads, {t['records']} verified records"
                         + (f", {t['candidates_measured']} candidates measured"
                            if t.get("candidates_measured") is not None else "")
                         + f"; TVM {_esc(v.get('tvm'))}, tvm-fusion {_esc(v.get('tvm_fusion'))}"
                         + (f"; <b>{len(t['skipped_lines'])} unreadable lines skipped</b>"
                            if t.get("skipped_lines") else "") + "</div>")
            if t["models"]:
                parts.append(_table(["model", "planner", "plan", "kernels", "trials"],
                                    [[m["label"], m["planner"], m["plan_hash"], m["kernels"],
                                      m["trials"]] for m in t["models"]], align_right=(3, 4)))
            rows = []
            for w in sorted(t["workloads"], key=lambda w: -(w["best_us"] or 0)):
                users = "; ".join(f"{u['kernel']} x{u['calls']}" for u in w["used_by"])
                rows.append([users or w["workload"], w["records"],
                             "-" if w["best_us"] is None else f"{w['best_us']:.2f}"])
            parts.append("<details open><summary>kernels, slowest first</summary>"
                         + _table(["kernel (calls per inference)", "records", "best us"], rows,
                                  align_right=(1, 2)) + "</details>")
        return "\n".join(parts)


def open_logs(path) -> LogView:
    """Read a tuning log directory (or one target directory of it) for display.

    Parameters
    ----------
    path : str or Path
        The directory given to :func:`tvm_fusion.tune` as ``logs``.
    """
    return LogView(path=Path(path), targets=tuple(show(path)))
