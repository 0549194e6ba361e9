"""Tuning curves: the model's estimated latency after each trial, from the tuning records.

Both tuners keep every measured candidate in a MetaSchedule JSONDatabase, in the order
measured: tvm-fusion in ``LOGS/<target>/candidates/`` (its manifest gives the plan that
was tuned), stock MetaSchedule in its ``work_dir``. After trial k the estimate is

    sum over tuning tasks of (best latency measured so far) x (calls per inference)

i.e. the tuner's own kernel measurements, not an end-to-end run; per-kernel call
overhead and anything outside the kernels are not in it. Until every task has a valid
measurement the sum covers only the measured ones; those points are flagged
(``complete`` False) and drawn dotted.
"""

from __future__ import annotations

import json
from pathlib import Path

from .stock_ms import is_valid, pre_tuning_module, read_database


def task_weights(mod, target) -> dict[str, int]:
    """Structural hash (as the database writes it) -> calls per inference, per task."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    tasks = ms.relax_integration.extract_tasks(mod, target)
    return {str(tvm_ffi.structural_hash(t.dispatched[0])): int(t.weight) for t in tasks}


def curve(db_dir: Path, weights: dict[str, int]) -> dict:
    """The estimate after every trial recorded in ``db_dir``."""
    hashes, records = read_database(db_dir)
    known = weights or {h: 1 for h in hashes}
    best: dict[str, float] = {}
    trials, est, complete = [], [], []
    for i, (idx, secs) in enumerate(records, start=1):
        h = hashes[idx] if 0 <= idx < len(hashes) else None
        if h in known and is_valid(secs):
            lat = sum(secs) / len(secs)
            if lat < best.get(h, float("inf")):
                best[h] = lat
        if best:
            trials.append(i)
            est.append(sum(best[h] * known[h] for h in best) * 1e3)
            complete.append(len(best) == len(known))
    note = "" if weights else "task weights unknown: every task counted once"
    if records and not best:
        note = "no valid measurement among the records"
    return {"trials": trials, "est_ms": est, "complete": complete, "tasks": len(known),
            "records": len(records), "note": note}


def fusion_curve(model, hw, logs: Path) -> dict:
    """tvm-fusion's curve, from ``logs/<target>/manifest.json`` and its candidates."""
    from tvm_fusion import apply_plan, build_graph
    from tvm_fusion.plan import FusionPlan

    tdir = Path(logs) / hw.name
    manifest = json.loads((tdir / "manifest.json").read_text())
    entry = manifest["models"][model.model_hash]
    fused = apply_plan(build_graph(model.mod), FusionPlan.from_json(entry["plan"]))
    out = curve(tdir / "candidates", task_weights(fused, hw.tvm_target()))
    out["manifest_trials"] = entry.get("trials")
    return out


def metaschedule_curve(model, hw, work_dir: Path) -> dict:
    """Stock MetaSchedule's curve, from its work_dir database."""
    target = hw.tvm_target()
    return curve(Path(work_dir), task_weights(pre_tuning_module(model.mod, target), target))
