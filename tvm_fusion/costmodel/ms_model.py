"""The pretrained ranking model as a MetaSchedule cost model.

It starts from the pretrained booster and keeps learning from this run: after each batch
of measurements it boosts a few extra rounds on top of the pretrained trees, over
everything measured in this run so far (the pretrained trees stay as they are, so what
was learned from other models is kept; the extra trees fit this run's kernels).
"""

from __future__ import annotations

import logging

import numpy as np
import tvm_ffi
import xgboost as xgb
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from ..targets import HardwareTarget
from ..logs.logdb import is_measured
from .features import FeatureBuilder
from .dataset import Dataset
from .model import RankModel, boost, candidate_scores, load_model

log = logging.getLogger(__name__)


@derived_object
class PretrainedCostModel(PyCostModel):
    """MetaSchedule ``PyCostModel`` backed by a pretrained :class:`RankModel`.

    Parameters
    ----------
    model : RankModel
        From :func:`~tvm_fusion.costmodel.load_model`.
    hw : HardwareTarget
        The hardware being tuned (gives the hardware features).
    update_rounds : int
        Boosting rounds added on this run's measurements at each update (0: never
        update, predict with the pretrained model alone).
    """

    def __init__(self, model: RankModel, hw: HardwareTarget, *, update_rounds: int = 30):
        self.model = model
        self.features = FeatureBuilder(hw)
        self.update_rounds = update_rounds
        self.booster: xgb.Booster = model.booster
        self._rows: list[np.ndarray] = []  # this run's measured candidates
        self._lat: list[float] = []
        self._wl: list[str] = []
        self.updates = 0

    def scores(self, context, candidates) -> np.ndarray:
        """Raw ranking scores of ``candidates`` (higher = predicted faster)."""
        rows = self.features.rows(context.mod, list(candidates), context)
        if not rows:
            return np.zeros(0)
        counts = np.array([len(r) for r in rows])
        return candidate_scores(self.booster, np.concatenate(rows), counts)

    def predict(self, context, candidates) -> np.ndarray:
        """Scores mapped to (0, 1], same order: the search treats scores as normalized
        throughput (it drops negative ones and samples parents in proportion)."""
        s = self.scores(context, candidates)
        if not len(s):
            return np.zeros(0, dtype="float64")
        return np.exp(np.clip(s - s.max(), -30.0, 0.0)).astype("float64")

    def update(self, context, candidates, results) -> None:
        """Add this batch's measurements and re-boost on top of the pretrained trees."""
        keep = [(c, r) for c, r in zip(candidates, results)
                if r.error_msg is None and is_measured(r.run_secs)]
        if not keep or self.update_rounds <= 0:
            return
        rows = self.features.rows(context.mod, [c for c, _ in keep], context)
        key = str(tvm_ffi.structural_hash(context.mod))
        self._rows += rows
        self._lat += [float(np.mean([float(s) for s in r.run_secs])) for _, r in keep]
        self._wl += [key] * len(rows)
        if len(set(self._wl)) == len(self._wl):  # no workload has two measurements: no pair
            return
        data = Dataset(stores=np.concatenate(self._rows),
                       counts=np.array([len(r) for r in self._rows]),
                       latency_s=np.array(self._lat), workload=np.array(self._wl, dtype=object),
                       source=np.array(["this run"] * len(self._wl), dtype=object),
                       targets=(self.features.hw.name,))
        params = dict(self.model.meta.get("params", {}))
        # From the pretrained trees each time, not from the last update: the extra
        # trees are refitted to everything this run measured, so they do not pile up.
        self.booster = boost(params, data, self.update_rounds, base=self.model.booster)
        self.updates += 1

    def load(self, path: str) -> None:
        """Replace the model with the one saved at ``path``."""
        self.model = load_model(path)
        self.booster = self.model.booster

    def save(self, path: str) -> None:
        """Save the current (pretrained + updated) booster with the pretrained metadata."""
        meta = {**self.model.meta, "updated_rounds": self.updates * self.update_rounds}
        RankModel(booster=self.booster, meta=meta).save(path)
