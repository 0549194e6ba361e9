"""The learned cost model: features, a pretrained XGBoost ranker, its MetaSchedule wrapper.

``train`` and ``eval`` are reached through ``tvm-fusion cost-model``; ``tune(...,
cost_model=PATH)`` plugs a saved model into the search. Names are imported on first use,
so the CLI does not pay for XGBoost before it needs it.
"""

from __future__ import annotations

import importlib
import warnings

import numpy as np

_EXPORTS = {
    "Dataset": "dataset", "load_dataset": "dataset",
    "FEATURE_VERSION": "features", "FeatureBuilder": "features", "feature_names": "features",
    "CostModelError": "model", "RankModel": "model", "format_metrics": "model",
    "load_model": "model", "rank_correlation": "model", "ranking_metrics": "model",
    "split_holdout": "model",
    "split_within": "model", "train_model": "model", "PretrainedCostModel": "ms_model",
}
__all__ = [*_EXPORTS, "make_cost_model"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_cost_model(model, hw, *, update_rounds: int = 30):
    """A MetaSchedule cost model from a saved model path (or a loaded RankModel).

    Parameters
    ----------
    model : path, RankModel or PretrainedCostModel (returned as it is)
    hw : HardwareTarget
        The hardware being tuned.
    update_rounds : int
        Rounds boosted on this run's measurements after each batch (0: frozen).

    Returns
    -------
    PretrainedCostModel
    """
    from .model import RankModel, load_model
    from .ms_model import PretrainedCostModel

    if isinstance(model, PretrainedCostModel):
        return model
    if not isinstance(model, RankModel):
        model = load_model(model)
    _warn_if_unseen_hardware(model, hw)
    return PretrainedCostModel(model, hw, update_rounds=update_rounds)


def _warn_if_unseen_hardware(model, hw) -> None:
    from .features import CALIBRATED_HW_NAMES, HW_NAMES, hardware_features

    # what the hardware is, not its calibrated numbers (peak, bandwidth, clock), which a
    # re-measured description changes for the same machine (targets.CALIBRATED_FIELDS)
    same = np.array([n not in CALIBRATED_HW_NAMES for n in HW_NAMES])
    seen = np.array(model.meta.get("hardware_rows", []), dtype=np.float64).reshape(
        -1, len(HW_NAMES))[:, same]
    row = hardware_features(hw).astype(np.float64)[same]
    if len(seen) and not np.any(np.all(np.abs(seen - row) <= 0.05 * np.abs(row) + 1e-3,
                                       axis=1)):
        warnings.warn(f"the cost model was trained on {model.meta.get('targets')}, whose "
                      f"hardware differs from {hw.name!r}: its ranking there is an "
                      "extrapolation (it still learns from this run's measurements)",
                      stacklevel=3)
