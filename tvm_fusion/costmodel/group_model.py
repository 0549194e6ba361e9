"""The learned group-latency model: a fused group's tuned time on a target.

The analytical model (:mod:`tvm_fusion.plan.cost`) is the prior. XGBoost regression
trees learn ``log(measured / analytical)`` of a group's best tuned kernel from the
group's features (FLOPs, bytes, op roles, GEMM/reduction dims, parallel tiles, layout,
dtype, the analytical model's own terms) and the target's (peaks, bandwidth, launch and
call overheads, vector width, cores). A learned time is ``analytical * exp(prediction)``,
on the kernel's time as the runner measures it (the VM's call added back on CPUs).

Training uses the records of logs tuned with at least ``MIN_TRIALS_PER_KERNEL`` trials per
kernel (fewer measure random schedules, not tuned ones).
Where the data is thin the analytical time stands alone, and the cost says why:
no records of the target's hardware (its hardware hash), fewer than ``MIN_RECORDS``, a
kind of group no training kernel was (a layout, dtype or convolution it never saw), or
a group whose size features lie more than ``RANGE_FACTOR`` beyond the training range.
:class:`LearnedCostModel` is the planner's seam (``group_cost(nodes) -> GroupCost``); its
``GroupCost.source`` reads ``learned: 1.80x analytical from 41 records`` or
``analytical: no learned model for x86_avx2``.

Stored as xgboost's own JSON or UBJ plus a sidecar ``FILE.meta.json``: schema, feature
list, per-target record counts, the feature ranges and kinds, the training data's provenance
(log directories, models, kernels). Never pickle.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from pathlib import Path

import numpy as np
import xgboost as xgb

from ..errors import CostModelError
from ..family import strategy
from ..plan import AnalyticalCostModel, GroupCost
from ..plan.cost import tvm_bits
from ..version import __version__
from .group_data import KernelRecord, kernel_us, vm_call_us
from .model import load_booster, read_sidecar, sidecar

SCHEMA = "tvm-fusion/group-model"
FEATURE_VERSION = 2  # 2: the sidecar's kinds of group (support)
MIN_RECORDS = 20     # measured kernels of a target before its learned times are used
RANGE_FACTOR = 2.0   # a size feature this far outside the training range: analytical
# Trials per kernel a model's logs need before their records count as tuned latencies: a
# 16-trial run of a 28-kernel model measured most kernels once, at a random schedule
MIN_TRIALS_PER_KERNEL = 4.0
# Shallow, strongly regularized trees: tens of records per model, and a prediction of 0
# (the analytical time) where the leaves have little data.
PARAMS = {"objective": "reg:squarederror", "eta": 0.1, "max_depth": 3,
          "min_child_weight": 3, "lambda": 4.0, "subsample": 0.9, "base_score": 0.0,
          "tree_method": "exact", "nthread": 1, "seed": 0}
ROUNDS = 80
ROLES = ("elementwise", "reduction", "contraction", "opaque")
GROUP_FEATURES = (
    "ops", *(f"n_{r}" for r in ROLES), "n_conv", "log_flops", "log_dram_bytes",
    "log_bytes_read", "log_bytes_written", "log_gemm_m", "log_gemm_n", "log_gemm_k",
    "log_reduce_len", "max_passes", "log_tiles", "parallel_fraction", "blocked_layout",
    "dtype_bits", "log_compute_us", "log_memory_us", "launch_us", "log_analytical_us",
    "compute_bound")
HW_FEATURES = ("hw_log_peak_fp32", "hw_log_dram_gbs", "hw_launch_us", "hw_call_us",
               "hw_vector_bits", "hw_units", "hw_gpu")
FEATURES = GROUP_FEATURES + HW_FEATURES
# size features checked against the training range (log values)
RANGE_FEATURES = ("log_flops", "log_dram_bytes", "log_analytical_us")
# kinds of group checked against the training data's: trees say nothing about a value no
# training kernel had (a blocked NCHW16c CNN priced by a model of transformer kernels)
SUPPORT_FEATURES = ("blocked_layout", "dtype_bits", "has_conv")


def _log(x: float) -> float:
    return math.log(max(float(x), 0.0) + 1.0)


def group_features(cm: AnalyticalCostModel, nodes) -> dict[str, float]:
    """The named features (:data:`FEATURES`) of the kernel computing ``nodes``."""
    members = sorted(set(nodes))
    cost = cm.group_cost(members)
    hw, graph = cm.hw, cm.graph
    infos = [cm.infos[n] for n in members]
    roles = [i.role for i in infos]
    gnodes = [graph.nodes[n] for n in members]
    contractions = [n for n in members if cm.infos[n].role == "contraction"]
    m = n = k = 0
    if contractions:
        big = max(contractions, key=lambda c: graph.nodes[c].flops)
        node, info = graph.nodes[big], cm.infos[big]
        shape = [max(int(d), 1) for d in node.shape] or [1]
        n = shape[1] if node.op.startswith("conv") and len(shape) >= 3 else shape[-1]
        m, k = info.out_elems // max(n, 1), info.reduce_len
    f = {"ops": len(members), **{f"n_{r}": roles.count(r) for r in ROLES},
         "n_conv": sum(g.op.startswith("conv") for g in gnodes),
         "log_flops": _log(cost.flops), "log_dram_bytes": _log(cost.dram_bytes),
         "log_bytes_read": _log(sum(g.bytes_read for g in gnodes)),
         "log_bytes_written": _log(sum(g.bytes_written for g in gnodes)),
         "log_gemm_m": _log(m), "log_gemm_n": _log(n), "log_gemm_k": _log(k),
         "log_reduce_len": _log(max((i.reduce_len for i in infos if i.role == "reduction"),
                                    default=0)),
         "max_passes": max(i.passes for i in infos),
         "log_tiles": _log(cost.tiles), "parallel_fraction": cost.parallel_fraction,
         "blocked_layout": float(any(len(g.shape) == 5 for g in gnodes)),
         "dtype_bits": min(tvm_bits(cm.operand_dtype(x)) for x in members),
         "log_compute_us": _log(cost.compute_us), "log_memory_us": _log(cost.memory_us),
         "launch_us": cost.launch_us, "log_analytical_us": _log(kernel_us(cost.total_us, hw)),
         "compute_bound": float(cost.bound == "compute")}
    f["has_conv"] = float(f["n_conv"] > 0)  # a support key, not a model input
    return {**f, **hw_features(hw)}


def hw_features(hw) -> dict[str, float]:
    """The target's features (:data:`HW_FEATURES`)."""
    return {"hw_log_peak_fp32": _log(hw.peak_fp32_flops), "hw_log_dram_gbs": _log(
        hw.dram_bandwidth_gbs), "hw_launch_us": hw.launch_overhead_us,
        "hw_call_us": vm_call_us(hw), "hw_vector_bits": float(hw.vector_width_bits or 0),
        "hw_units": float(hw.compute_units), "hw_gpu": float(strategy(hw).is_gpu)}


def feature_matrix(records: list[KernelRecord]) -> np.ndarray:
    """One row of :data:`FEATURES` per record."""
    return _rows([group_features(r.cost_model, r.nodes) for r in records])


def _rows(feats: list[dict[str, float]]) -> np.ndarray:
    return np.array([[f[k] for k in FEATURES] for f in feats], dtype=float)


@dataclasses.dataclass(frozen=True)
class GroupModel:
    """A trained booster and its sidecar (``meta``); see the module docstring."""

    booster: xgb.Booster
    meta: dict

    def records_for(self, hw) -> int:
        """Training records of ``hw``'s hardware (0: none)."""
        known = self.meta["targets"]
        key = next((h for h in (hw.hardware_hash, *hw.previous_hashes) if h in known), None)
        return int(known[key].get("records", 0)) if key else 0

    def thin(self, hw, features: dict[str, float]) -> str | None:
        """Why the learned time is not used for a group (None: it is)."""
        records = self.records_for(hw)
        if records == 0:
            return f"no learned model for {hw.name}"
        least = int(self.meta.get("min_records", MIN_RECORDS))
        if records < least:
            return f"{records} learned records for {hw.name}, fewer than {least}"
        for key in SUPPORT_FEATURES:
            if features[key] not in self.meta["support"][key]:
                return (f"no training kernel with {key} = {features[key]:g} (trained on "
                        f"{', '.join(f'{v:g}' for v in self.meta['support'][key])})")
        span = math.log(RANGE_FACTOR)
        for key in RANGE_FEATURES:
            lo, hi = self.meta["ranges"][key]
            if not lo - span <= features[key] <= hi + span:
                return (f"{key[4:]} {math.expm1(features[key]):.3g} outside the learned "
                        f"model's range ({math.expm1(lo):.3g}-{math.expm1(hi):.3g})")
        return None

    def log_ratio(self, rows: np.ndarray) -> np.ndarray:
        """Predicted ``log(measured / analytical)`` per feature row."""
        return self.booster.predict(xgb.DMatrix(rows, feature_names=list(FEATURES)))

    def cost_model(self, graph, hw, infos=None) -> "LearnedCostModel":
        """The planner's seam on ``graph`` and ``hw`` (``make_plan(group_model=...)``)."""
        return LearnedCostModel(AnalyticalCostModel(graph, hw, infos), self)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the booster (``.json`` or ``.ubj``, by suffix) and ``PATH.meta.json``."""
        path = Path(path)
        if path.suffix not in (".json", ".ubj"):
            raise CostModelError(f"group model file {path}: expected a .json or .ubj "
                                 "name (xgboost's own formats)")
        self.booster.save_model(str(path))
        sidecar(path).write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")
        return path


class LearnedCostModel:
    """Group costs with the learned time where the data supports it, else analytical.

    The returned :class:`GroupCost` is the analytical one with ``total_us`` replaced
    and ``source`` saying which time it is and why; everything else the planner reads
    (legality, on-chip fit, GPU resources) stays the analytical model's (``analytical``).
    """

    prices_private = True  # group_cost takes ``private`` (the planner's duplication)

    def __init__(self, analytical: AnalyticalCostModel, model: GroupModel):
        self.analytical, self.model = analytical, model
        self.graph, self.hw, self.infos = analytical.graph, analytical.hw, analytical.infos
        self._cache: dict = {}

    def group_cost(self, nodes, *, private=()) -> GroupCost:
        """The learned :class:`GroupCost` of one kernel computing ``nodes``."""
        key = (frozenset(nodes), frozenset(private))
        if key not in self._cache:
            base = self.analytical.group_cost(nodes, private=private)
            feats = group_features(self.analytical, nodes)
            why = self.model.thin(self.hw, feats)
            if why is not None:
                cost = dataclasses.replace(base, source=f"analytical: {why}")
            else:
                ratio = float(np.exp(self.model.log_ratio(_rows([feats]))[0]))
                call = vm_call_us(self.hw)
                total = kernel_us(base.total_us, self.hw) * ratio + call
                cost = dataclasses.replace(base, total_us=total, source=(
                    f"learned: {ratio:.2f}x analytical from "
                    f"{self.model.records_for(self.hw)} records"))
            self._cache[key] = cost
        return self._cache[key]


def tuned(records: list[KernelRecord]) -> list[KernelRecord]:
    """The records of logs tuned with at least ``MIN_TRIALS_PER_KERNEL`` trials a kernel."""
    return [r for r in records if r.trials_per_kernel >= MIN_TRIALS_PER_KERNEL]


def train_group_model(records: list[KernelRecord], *, rounds: int = ROUNDS,
                      min_records: int = MIN_RECORDS) -> GroupModel:
    """Fit the log-ratio model on measured kernels (:func:`.group_data.kernel_records`).

    ``min_records``: measured kernels a target needs before its learned times are used
    (stored in the sidecar).
    """
    measured = len(records)
    records = tuned(records)
    if not records:
        raise CostModelError(f"no tuned kernels to train a group model on ({measured} "
                             f"measured, all in logs with fewer than "
                             f"{MIN_TRIALS_PER_KERNEL:g} trials per kernel); pass --logs "
                             "directories that `tvm-fusion tune` tuned with a real budget")
    feats = [group_features(r.cost_model, r.nodes) for r in records]
    x = _rows(feats)
    y = np.array([math.log(r.meas_us / r.analytical_us) for r in records])
    booster = xgb.train(PARAMS, xgb.DMatrix(x, label=y, feature_names=list(FEATURES)),
                        num_boost_round=rounds)
    targets: dict[str, dict] = {}
    for r in records:
        t = targets.setdefault(r.cost_model.hw.hardware_hash,
                               {"name": r.cost_model.hw.name, "records": 0})
        t["records"] += 1
    cols = {k: x[:, i] for i, k in enumerate(FEATURES)}
    meta = {"schema": SCHEMA, "feature_version": FEATURE_VERSION, "features": list(FEATURES),
            "label": "log(measured_us / analytical_us), the kernel alone",
            "params": PARAMS, "rounds": rounds, "min_records": min_records,
            "tvm_fusion": __version__,
            "trained": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "targets": targets,
            "ranges": {k: [float(cols[k].min()), float(cols[k].max())] for k in RANGE_FEATURES},
            "support": {k: sorted({float(f[k]) for f in feats}) for k in SUPPORT_FEATURES},
            "provenance": sorted({(r.logs, r.model) for r in records}),
            "kernels": len(records), "untuned_skipped": measured - len(records),
            "min_trials_per_kernel": MIN_TRIALS_PER_KERNEL}
    meta["provenance"] = [{"logs": d, "model": m, "kernels": sum(
        1 for r in records if (r.logs, r.model) == (d, m))} for d, m in meta["provenance"]]
    return GroupModel(booster=booster, meta=meta)


def find_group_model() -> str | None:
    """``--group-model auto``: ``$TVM_FUSION_GROUP_MODEL`` (``none`` turns it off), else
    the shipped ``tuning_logs/group_model.json`` where there is one, else None."""
    from ..config import GROUP_MODEL
    from ..data import shipped_logs_dir

    env = GROUP_MODEL.get()
    if env:
        return None if env == "none" else env
    shipped = shipped_logs_dir() / "group_model.json"
    return str(shipped) if shipped.is_file() else None


def load_group_model(path: str | os.PathLike) -> GroupModel:
    """Read a group model and its sidecar; a wrong schema or feature list is an error."""
    path = Path(path)
    if not path.is_file():
        raise CostModelError(f"group model {path} does not exist; train one with "
                             "`tvm-fusion train-group-model --logs DIR -o FILE`")
    try:
        meta = read_sidecar(sidecar(path), f"the sidecar of group model {path}")
    except FileNotFoundError:
        raise CostModelError(f"group model {path} has no sidecar {sidecar(path)}; it is "
                             "written beside the model by train-group-model") from None
    if (meta.get("schema") != SCHEMA or meta.get("features") != list(FEATURES)
            or meta.get("feature_version") != FEATURE_VERSION or not _meta_ok(meta)):
        raise CostModelError(f"{path} is not a group model of this tvm-fusion (schema "
                             f"{meta.get('schema')!r}, feature version "
                             f"{meta.get('feature_version')!r}, this one {FEATURE_VERSION}, "
                             "or its sidecar's targets, support or ranges are damaged); "
                             "retrain it with `tvm-fusion train-group-model`")
    return GroupModel(booster=load_booster(path, f"group model {path}"), meta=meta)


def _meta_ok(meta: dict) -> bool:
    """The sidecar fields :meth:`GroupModel.thin` reads have their shapes."""
    targets, support, ranges = (meta.get(k) for k in ("targets", "support", "ranges"))
    try:
        return (all(isinstance(t, dict) and isinstance(t.get("records", 0), int)
                    for t in targets.values())
                and isinstance(meta.get("min_records", 0), int)
                and all(float(v) == v for k in SUPPORT_FEATURES for v in support[k])
                and all(float(lo) <= float(hi) for lo, hi in
                        (ranges[k] for k in RANGE_FEATURES)))
    except (AttributeError, KeyError, TypeError, ValueError):
        return False
