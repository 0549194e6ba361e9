"""Tuning curves of the two tuners, as plain dicts for ``results.json``.

The curve itself is :mod:`tvm_fusion.explore.tuning`'s: after trial k, the sum over
tuning tasks of (best latency measured so far) x (calls per inference), where a task not
yet measured counts with its first measurement. These are the tuners' own kernel
measurements, not an end-to-end run; per-kernel call overhead is not in them.
tvm-fusion's candidates are read from ``LOGS/<target>/candidates/`` (its manifest gives
the plan that was tuned), stock MetaSchedule's from its ``work_dir``.
"""

from __future__ import annotations

from pathlib import Path


def _as_dict(c, records: int | None = None) -> dict:
    note = ""
    if c.unmeasured:
        note = f"{c.unmeasured} of {c.tasks} tasks never got a valid measurement"
    if not c.trials:
        note = "no valid measurement among the records"
    return {"trials": list(c.trials), "est_ms": list(c.est_ms), "complete": list(c.complete),
            "tasks": c.tasks, "unmeasured": c.unmeasured,
            "records": records if records is not None else len(c.trials), "note": note}


def fusion_curve(model, hw, logs: Path) -> dict:
    """tvm-fusion's curve, from ``logs/<target>/manifest.json`` and its candidates."""
    import json

    from tvm_fusion.explore.tuning import tuning_curve

    out = _as_dict(tuning_curve(model, hw, logs))
    manifest = json.loads((Path(logs) / hw.name / "manifest.json").read_text())
    out["manifest_trials"] = manifest["models"][model.model_hash].get("trials")
    return out


def metaschedule_curve(model, hw, work_dir: Path, prepack: bool = False) -> dict:
    """Stock MetaSchedule's curve, from its work_dir database (``prepack``: tuned with
    ``cpu_weight_prepack=True``)."""
    from tvm_fusion.explore.tuning import metaschedule_curve as curve

    return _as_dict(curve(model, hw, work_dir, prepack=prepack))
