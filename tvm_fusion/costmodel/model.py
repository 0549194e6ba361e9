"""The pretrained ranking model: XGBoost trees over store rows, trained to rank.

What matters to a schedule search is the order of candidates of one kernel, not their
absolute latency, so the model learns to rank: a candidate's score is the sum of the
trees' outputs over its store rows (as in MetaSchedule's own model), and training
minimizes the pairwise logistic loss (RankNet / XGBoost's ``rank:pairwise``) between
candidates of the same workload, ordered by measured latency. XGBoost's built-in
ranking objectives score one row per item, so the loss is supplied as a custom
objective that spreads each candidate's gradient over its rows.

Saved as xgboost's own JSON (or UBJ) plus a sidecar ``MODEL.meta.json`` (schema, feature
version, targets, data size, training workloads, metrics). Never pickle.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb

from ..errors import CostModelError
from .dataset import Dataset
from .features import FEATURE_VERSION, HW_NAMES, feature_names

MODEL_SCHEMA = "tvm-fusion/costmodel"
OBJECTIVE = "pairwise-logistic over summed store rows"
METRICS_DEFINITION = "tenset"  # sidecars without it hold pooled pairs and best-of-k top-5
# With 11000 candidates of 320 kernels (random samples added), depth-8 trees beat
# depth 6 by about 0.005 pairwise and 0.01-0.03 top-1 held out; 1000 rounds score as
# 300 do in a 12 MB file instead of 4 MB (tuning_logs/x86_zen4/README.md).
DEFAULT_ROUNDS = 300
DEFAULT_PARAMS = {
    "eta": 0.05,
    "max_depth": 8,
    "min_child_weight": 4,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "base_score": 0.0,  # scores are sums over rows: no per-row offset
    "tree_method": "hist",
    "nthread": 2,
}


def _groups(workload: np.ndarray) -> list[np.ndarray]:
    """Candidate indices of each workload with 2+ candidates."""
    keys = workload.tolist()
    by: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by.setdefault(k, []).append(i)
    return [np.array(v) for v in by.values() if len(v) > 1]


def pairwise_objective(owner: np.ndarray, latency_s: np.ndarray, workload: np.ndarray):
    """XGBoost custom objective: pairwise logistic loss of per-candidate summed scores.

    For each workload, every pair (i faster than j) adds ``log(1 + exp(s_j - s_i))``,
    normalized by the workload's pair count so that a kernel with 64 measured
    candidates does not drown one with 4. Gradients reach every store row of a
    candidate unchanged (the score is a plain sum).
    """
    groups = _groups(workload)
    n = len(latency_s)

    def obj(pred: np.ndarray, _dtrain) -> tuple[np.ndarray, np.ndarray]:
        s = np.bincount(owner, weights=pred, minlength=n)
        g, h = np.zeros(n), np.zeros(n)
        for gi in groups:
            ss, lat = s[gi], latency_s[gi]
            better = (lat[:, None] < lat[None, :]).astype(float)  # i faster than j
            pairs = better.sum()
            if not pairs:
                continue
            p = 1.0 / (1.0 + np.exp(-(ss[:, None] - ss[None, :])))
            gij = -(1.0 - p) * better
            hij = p * (1.0 - p) * better
            scale = len(gi) / pairs
            g[gi] += (gij.sum(1) - gij.sum(0)) * scale
            h[gi] += (hij.sum(1) + hij.sum(0)) * scale
        return g[owner], np.maximum(h, 1e-6)[owner]

    return obj


def candidate_scores(booster: xgb.Booster, stores: np.ndarray, counts: np.ndarray
                     ) -> np.ndarray:
    """Per-candidate scores: the booster's outputs summed over each candidate's rows."""
    if not len(counts):
        return np.zeros(0)
    owner = np.repeat(np.arange(len(counts)), counts)
    pred = booster.predict(xgb.DMatrix(stores)) if len(stores) else np.zeros(0)
    return np.bincount(owner, weights=pred, minlength=len(counts))


def boost(params: dict, data: Dataset, rounds: int, base: xgb.Booster | None = None
          ) -> xgb.Booster:
    """Train ``rounds`` trees on ``data`` (on top of ``base`` when given)."""
    return xgb.train(params, xgb.DMatrix(data.stores), num_boost_round=rounds,
                     obj=pairwise_objective(data.owner, data.latency_s, data.workload),
                     xgb_model=base)


def _peak_score(scores: np.ndarray, throughput: np.ndarray, k: int) -> float:
    """Mean over the first ``k`` picks (highest score first) of best-so-far / best."""
    picked = throughput[np.argsort(-scores, kind="stable")[:k]]
    return float(np.mean(np.maximum.accumulate(picked) / throughput.max()))


def ranking_metrics(scores: np.ndarray, latency_s: np.ndarray, workload: np.ndarray
                    ) -> dict[str, Any]:
    """TenSet's ranking metrics of ``scores`` (higher = predicted faster).

    As TenSet's ``evaluate_model`` computes them, so that the numbers compare with its
    published ones: each metric is computed per workload, then averaged over workloads
    weighted by their candidate counts. Unlike TenSet, workloads with a single candidate
    are left out (TenSet counts them as 0.5 pairwise and 1.0 peak, whatever the model).

    pairwise_accuracy: the share of a workload's n(n-1)/2 candidate pairs whose order by
    score agrees with their order by throughput. top1 / top5: TenSet's peak score, the
    mean over the first k candidates by score of (best throughput so far) / (best
    throughput measured).

    pooled_pairwise_accuracy: a stricter reading, over every pair of candidates of one
    workload with different latencies, pooled over workloads (so a workload with n
    candidates counts about n^2 times); ``pairs`` is their number.
    """
    right = total = 0
    per: dict[str, list[float]] = {"pairwise_accuracy": [], "top1": [], "top5": []}
    weights = []
    for key in np.unique(workload):
        m = workload == key
        s, lat = scores[m], latency_s[m]
        n = len(lat)
        if n < 2:
            continue
        weights.append(n)
        thr = 1.0 / lat
        agree = np.triu((s[:, None] > s[None, :]) == (thr[:, None] > thr[None, :]), 1)
        per["pairwise_accuracy"].append(float(agree.sum()) / (n * (n - 1) / 2))
        ds = s[:, None] - s[None, :]
        dl = lat[None, :] - lat[:, None]  # > 0 where row i is faster than column j
        valid = np.triu(dl != 0, 1)
        right += int(np.sum(valid & (np.sign(ds) == np.sign(dl))))
        total += int(np.sum(valid))
        per["top1"].append(_peak_score(s, thr, 1))
        per["top5"].append(_peak_score(s, thr, 5))
    out: dict[str, Any] = {
        name: float(np.average(v, weights=weights)) if weights else float("nan")
        for name, v in per.items()}
    out.update({"workloads": len(weights), "candidates": int(sum(weights)),
                "pooled_pairwise_accuracy": right / total if total else float("nan"),
                "pairs": total, "definition": METRICS_DEFINITION})
    return out


def ranks_in_unit(x: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1] (ties broken by order; fine for a picture and for rho)."""
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(len(x))
    return r / max(len(x) - 1, 1)


def rank_correlation(scores: np.ndarray, latency_s: np.ndarray, workload: np.ndarray
                     ) -> float:
    """Mean over workloads (2+ candidates) of Spearman's rho of score vs throughput."""
    rhos, sizes = [], []
    for key in np.unique(workload):
        m = workload == key
        if m.sum() < 3:
            continue
        a, b = ranks_in_unit(scores[m]), ranks_in_unit(-latency_s[m])
        if a.std() == 0 or b.std() == 0:
            continue
        rhos.append(float(np.corrcoef(a, b)[0, 1]))
        sizes.append(int(m.sum()))
    return float(np.average(rhos, weights=sizes)) if rhos else float("nan")


def format_metrics(m: dict[str, Any]) -> str:
    """The metrics as a few lines of text."""
    if m.get("definition") != METRICS_DEFINITION:  # a sidecar written before 2026-11-30
        return (f"pairwise accuracy {m['pairwise_accuracy']:.4f} over {m['pairs']} pairs "
                f"(pooled)\ntop-1 peak score  {m['top1']:.4f}\n"
                f"top-5 best of 5   {m['top5']:.4f}\n{m['candidates']} candidates")
    return (f"pairwise accuracy {m['pairwise_accuracy']:.4f}  (TenSet: per workload, "
            f"weighted by candidates)\n"
            f"top-1 peak score  {m['top1']:.4f}\n"
            f"top-5 peak score  {m['top5']:.4f}\n"
            f"pooled pairwise   {m['pooled_pairwise_accuracy']:.4f} over {m['pairs']} pairs "
            f"with different latencies\n"
            f"{m['candidates']} candidates of {m['workloads']} workloads with 2+ candidates")


@dataclass(frozen=True, kw_only=True)
class RankModel:
    """A trained ranking booster with its metadata (the sidecar's contents)."""

    booster: xgb.Booster
    meta: dict = field(default_factory=dict)

    @property
    def train_workloads(self) -> frozenset[str]:
        """Workload keys the model was trained on (excluded from held-out evaluation)."""
        return frozenset(self.meta.get("train_workloads", ()))

    def predict(self, data: Dataset) -> np.ndarray:
        """Ranking scores of ``data``'s candidates: higher means predicted faster."""
        if data.stores.shape[1] != len(feature_names()):
            raise CostModelError(f"store rows have {data.stores.shape[1]} columns; this "
                                 f"model (feature version {FEATURE_VERSION}) expects "
                                 f"{len(feature_names())}")
        return candidate_scores(self.booster, data.stores, data.counts)

    def evaluate(self, data: Dataset) -> dict[str, Any]:
        """:func:`ranking_metrics` of this model on ``data``."""
        return ranking_metrics(self.predict(data), data.latency_s, data.workload)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the booster (``.json`` or ``.ubj``, by suffix) and ``PATH.meta.json``."""
        path = Path(path)
        if path.suffix not in (".json", ".ubj"):
            raise CostModelError(f"model path {path} must end in .json or .ubj (xgboost's "
                                 "own formats); got suffix {path.suffix!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(path))
        sidecar(path).write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")
        return path


def sidecar(path: str | os.PathLike) -> Path:
    """The metadata file beside a model file."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def load_model(path: str | os.PathLike) -> RankModel:
    """Load a model saved by :meth:`RankModel.save`, checking its feature version.

    Raises
    ------
    CostModelError
        Missing files, a sidecar that is not a JSON object of this schema and feature
        version (or whose fields have the wrong types), or a model file that xgboost
        cannot read or that takes another number of features.
    """
    path = Path(path)
    meta_path = sidecar(path)
    if not path.is_file():
        raise CostModelError(f"cost model {path} does not exist; train one with "
                             "`tvm-fusion cost-model train --logs DIR -o MODEL.json`")
    if not meta_path.is_file():
        raise CostModelError(f"cost model {path} has no sidecar {meta_path}; it is needed "
                             "for the feature version. Re-train or restore the file")
    meta = read_sidecar(meta_path, f"the sidecar of cost model {path}")
    if meta.get("schema") != MODEL_SCHEMA:
        raise CostModelError(f"{meta_path}: schema {meta.get('schema')!r}, expected "
                             f"{MODEL_SCHEMA!r}")
    if meta.get("feature_version") != FEATURE_VERSION:
        raise CostModelError(
            f"cost model {path} was trained with feature version "
            f"{meta.get('feature_version')!r}, but this tvm-fusion computes feature version "
            f"{FEATURE_VERSION}: its predictions would be meaningless. Re-train it from "
            f"the tuning logs: `tvm-fusion cost-model train --logs DIR -o {path.name}`")
    _check_meta(meta, meta_path)
    booster = load_booster(path, f"cost model {path}")
    if booster.num_features() != len(feature_names()):
        raise CostModelError(f"cost model {path} takes {booster.num_features()} features, "
                             f"this tvm-fusion computes {len(feature_names())} (feature "
                             f"version {FEATURE_VERSION}); the file does not belong to its "
                             f"sidecar {meta_path.name}: re-train it or restore both files")
    _check_params(booster, meta.get("params", {}), meta_path)
    return RankModel(booster=booster, meta=meta)


def read_sidecar(path: Path, what: str) -> dict:
    """The JSON object in a model's sidecar ``path`` (``what``: its name in messages).

    Raises
    ------
    CostModelError
        A file that cannot be read, is not UTF-8 JSON, or holds no JSON object.
    """
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise  # the callers say which model lacks it
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CostModelError(f"{path} ({what}) is not valid JSON ({e}); re-train the model "
                             "or restore the file") from None
    if not isinstance(meta, dict):
        raise CostModelError(f"{path} ({what}) holds {_json_kind(meta)}, not an object; "
                             "re-train the model or restore the file")
    return meta


def load_booster(path: Path, what: str) -> xgb.Booster:
    """xgboost's model in ``path`` (its JSON or UBJ format), or a :class:`CostModelError`
    naming it (``what``) when xgboost cannot read it."""
    booster = xgb.Booster()
    try:
        booster.load_model(str(path))
    except (xgb.core.XGBoostError, UnicodeDecodeError) as e:
        # xgboost quotes the file's bytes in its message, which may not decode
        why = _reason(e) if isinstance(e, xgb.core.XGBoostError) else "unreadable bytes"
        raise CostModelError(f"{what} is not an xgboost model ({why}); re-train it or "
                             "restore the file") from None
    return booster


def _check_params(booster: xgb.Booster, params: dict, meta_path: Path) -> None:
    """The sidecar's training parameters are ones xgboost takes: tuning boosts with them
    after its first batch, where a bad one would fail minutes into the run."""
    try:
        probe = booster.copy()
        probe.set_param({str(k): str(v) for k, v in params.items()})
        probe.predict(xgb.DMatrix(np.zeros((1, booster.num_features()))))  # checks them
    except xgb.core.XGBoostError as e:
        raise CostModelError(f"{meta_path}: xgboost refuses its 'params' ({_reason(e)}); "
                             "re-train the model or restore the file") from None


def _reason(e: Exception) -> str:
    """The first line of xgboost's message, without its time stamp and source file."""
    why = (str(e).strip().splitlines() or [""])[0]
    return why.split(": ", 1)[-1] if why.startswith("[") else why


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words: "a list", "an object", "a string"..."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number"}
    return kinds.get(type(value), "null")


# sidecar fields read after loading, and the JSON types they must have
_META_TYPES = {"hardware_rows": list, "params": dict, "targets": list,
               "train_workloads": list, "data": dict, "metrics": dict}


def _check_meta(meta: dict, meta_path: Path) -> None:
    """The sidecar's fields have the types that training, tuning and eval read."""
    for key, kind in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], kind):
            raise CostModelError(f"{meta_path}: {key!r} is {_json_kind(meta[key])}, expected "
                                 f"{_json_kind(kind())}; re-train the model or restore the "
                                 "file")
    for key in ("targets", "train_workloads"):
        if not all(isinstance(x, str) for x in meta.get(key, ())):
            raise CostModelError(f"{meta_path}: {key!r} holds other things than names; "
                                 "re-train the model or restore the file")
    try:
        np.array(meta.get("hardware_rows", []), dtype=np.float64).reshape(-1, len(HW_NAMES))
    except (ValueError, TypeError):
        raise CostModelError(f"{meta_path}: 'hardware_rows' is not a list of rows of "
                             f"{len(HW_NAMES)} numbers; re-train the model or restore the "
                             "file") from None


def split_holdout(data: Dataset, holdout: str) -> tuple[Dataset, Dataset]:
    """Split ``data`` into (train, held out) by workload.

    ``holdout`` is either a fraction (``"0.2"``: that share of workloads at random,
    seeded) or a substring of database paths (``"ppocr-cls"``: every workload measured
    in a matching database, i.e. one model's kernels). A held-out workload leaves the
    training set entirely, also where another database measured it too.
    """
    keys = np.array(data.workloads, dtype=object)
    try:
        frac = float(holdout)
    except ValueError:
        frac = None
    if frac is not None:
        if not 0 < frac < 1:
            raise CostModelError(f"--holdout fraction must be in (0, 1), got {frac}")
        rng = np.random.default_rng(0)
        held = set(rng.choice(keys, max(1, int(round(frac * len(keys)))), replace=False))
    else:
        held = {w for w, s in zip(data.workload.tolist(), data.source.tolist()) if holdout in s}
        if not held:
            raise CostModelError(f"--holdout {holdout!r} matches no database path; paths "
                                 f"are: {sorted(set(data.source.tolist()))}")
    mask = np.array([w in held for w in data.workload.tolist()])
    return data.subset(~mask), data.subset(mask)


def split_within(data: Dataset, fraction: float, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Split ``data`` into (train, held out) within every workload.

    TenSet's default protocol (``split_scheme="within_task"``, train ratio 0.9), under
    which its published reference numbers were measured: each workload's candidates are
    shuffled and the last ``fraction`` of them held out, so every held-out candidate's
    kernel is also in training. It measures how well new schedules of known kernels are
    ranked; :func:`split_holdout` measures unseen kernels, the harder question.
    """
    if not 0 < fraction < 1:
        raise CostModelError(f"--holdout fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    held = np.zeros(len(data), dtype=bool)
    for key in data.workloads:
        idx = rng.permutation(np.flatnonzero(data.workload == key))
        held[idx[int(len(idx) * (1 - fraction)):]] = True  # TenSet: int(n * train_ratio)
    return data.subset(~held), data.subset(held)


def train_model(data: Dataset, *, rounds: int = DEFAULT_ROUNDS, params: dict | None = None,
                holdout: Dataset | None = None, split: str = "workloads", seed: int = 0,
                base: RankModel | None = None) -> RankModel:
    """Train a ranking model on ``data`` (metrics on ``holdout`` when given).

    Parameters
    ----------
    data : Dataset
        Training rows; workloads with a single candidate carry no pair and are ignored
        by the ranking objective.
    rounds : int
        Boosting rounds.
    params : dict, optional
        XGBoost parameters over :data:`DEFAULT_PARAMS`.
    holdout : Dataset, optional
        Candidates kept out of training; their metrics go into the sidecar.
    split : {"workloads", "within"}
        How ``holdout`` was drawn (:func:`split_holdout` or :func:`split_within`), for
        the sidecar.
    seed : int
        XGBoost's seed.
    base : RankModel, optional
        Fine-tune: start from this model's trees (e.g. another machine's) and add
        ``rounds`` trees fitted to ``data``. The result counts the base's training
        workloads, targets and hardware rows as its own; ``holdout`` should hold none
        of the base's workloads (the CLI drops them).
    """
    if len(data) < 2 or len(data.workloads) == len(data):
        raise CostModelError(f"training needs workloads with 2+ measured candidates; got "
                             f"{data.summary()}. Tune with more trials first")
    p = {**DEFAULT_PARAMS, **(params or {}), "seed": seed}
    booster = boost(p, data, rounds, base=base.booster if base is not None else None)
    model = RankModel(booster=booster, meta={})
    metrics = {"train": model.evaluate(data)}
    if holdout is not None and len(holdout):
        metrics["holdout"] = model.evaluate(holdout)
    hw_rows = data.stores[:, -len(HW_NAMES):]
    seen, targets, total = set(data.workloads), set(data.targets), rounds
    if base is not None:
        seen |= base.train_workloads
        targets |= set(base.meta.get("targets", ()))
        total += base.booster.num_boosted_rounds()
        hw_rows = np.concatenate([hw_rows, np.array(base.meta.get("hardware_rows", []),
                                                    dtype=np.float32).reshape(-1, len(HW_NAMES))])
    meta = {
        "schema": MODEL_SCHEMA, "feature_version": FEATURE_VERSION,
        "features": len(feature_names()), "targets": sorted(targets),
        "objective": OBJECTIVE, "params": p, "rounds": total,
        "data": {"candidates": len(data), "workloads": len(data.workloads),
                 "databases": sorted(set(data.source.tolist())), "skipped": data.skipped,
                 "holdout_candidates": len(holdout) if holdout is not None else 0,
                 "holdout_workloads": len(holdout.workloads) if holdout is not None else 0,
                 "holdout_split": split},
        "train_workloads": sorted(seen), "metrics": metrics,
        # the hardware rows it learned from, so a user tuning other hardware is told
        "hardware_rows": np.unique(hw_rows, axis=0).tolist(),
        "xgboost": xgb.__version__,
    }
    if base is not None:  # what the fine-tuned trees started from
        meta["base"] = {k: base.meta.get(k) for k in ("targets", "rounds", "params")}
        meta["base"]["data"] = {k: base.meta.get("data", {}).get(k)
                                for k in ("candidates", "workloads", "holdout_candidates")}
        meta["base"]["holdout"] = base.meta.get("metrics", {}).get("holdout")
        meta["base"]["new_rounds"] = rounds
    return RankModel(booster=booster, meta=meta)
