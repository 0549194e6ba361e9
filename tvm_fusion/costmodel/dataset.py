"""Training data for the cost model, read from tuning logs.

Any directory holding a MetaSchedule JSONDatabase pair (``database_workload.json`` +
``database_tuning_record.json``) counts, searched recursively: tvm-fusion's
``LOGS/<target>/`` and ``LOGS/<target>/candidates/`` as well as a stock MetaSchedule
work directory. Each record's trace is replayed on its workload to get the scheduled
module, whose features become one row, labelled with its measured latency. Lines that do
not parse, traces that do not replay and failed measurements are skipped and counted,
never fatal.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tvm.s_tir import meta_schedule as ms

from ..errors import CostModelError
from ..targets import HardwareTarget
from ..logs.logdb import RECORD_FILE, WORKLOAD_FILE, is_measured, read_rows
from .features import FEATURE_VERSION, FeatureBuilder, feature_names



@dataclass(frozen=True, kw_only=True)
class Dataset:
    """Feature rows of measured candidates, grouped by workload.

    Attributes
    ----------
    stores : ndarray (store rows x features)
        The store rows of all candidates, candidate after candidate.
    counts : ndarray (candidates,)
        How many store rows each candidate has.
    latency_s : ndarray (candidates,)
        Mean measured run time of each candidate.
    workload : ndarray (candidates,) of str
        Workload key (MetaSchedule's structural hash of the unscheduled kernel): the
        ranking group.
    source : ndarray (candidates,) of str
        The log directory each candidate came from.
    targets : tuple of str
        Hardware targets of the rows.
    skipped : dict
        Reason -> count of records left out.
    """

    stores: np.ndarray
    counts: np.ndarray
    latency_s: np.ndarray
    workload: np.ndarray
    source: np.ndarray
    targets: tuple[str, ...]
    skipped: dict = field(default_factory=dict)
    feature_version: int = FEATURE_VERSION

    def __len__(self) -> int:
        return len(self.latency_s)

    @property
    def workloads(self) -> list[str]:
        """Distinct workload keys, in first-seen order."""
        return list(dict.fromkeys(self.workload.tolist()))

    @property
    def owner(self) -> np.ndarray:
        """Candidate index of each store row."""
        return np.repeat(np.arange(len(self.counts)), self.counts)

    def subset(self, mask: np.ndarray) -> "Dataset":
        """The candidates where ``mask`` is true."""
        return Dataset(stores=self.stores[mask[self.owner]], counts=self.counts[mask],
                       latency_s=self.latency_s[mask],
                       workload=self.workload[mask], source=self.source[mask],
                       targets=self.targets, skipped=dict(self.skipped))

    def summary(self) -> str:
        """One line: rows, workloads, sources, skipped records."""
        multi = sum(c >= 2 for c in Counter(self.workload.tolist()).values())
        skipped = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items())) or "none"
        return (f"{len(self)} measured candidates of {len(self.workloads)} workloads "
                f"({multi} with 2+ candidates) from {len(set(self.source.tolist()))} "
                f"databases; skipped: {skipped}")


def find_databases(roots: list[str | os.PathLike]) -> list[Path]:
    """Directories under ``roots`` holding a JSONDatabase pair, sorted."""
    found = set()
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise CostModelError(f"log directory {root} does not exist; pass a tuning log "
                                 "directory (LOGS, LOGS/<target> or a MetaSchedule work dir)")
        for wl in root.rglob(WORKLOAD_FILE):
            if (wl.parent / RECORD_FILE).exists():
                found.add(wl.parent)
    return sorted(found)


def _read_database(path: Path, skipped: Counter):
    """Yield (workload key, TuningRecord) of one JSONDatabase pair, skipping bad lines."""
    workloads: dict[int, tuple[str, ms.database.Workload]] = {}
    wl_rows, rec_rows = read_rows(path)
    for i, obj in enumerate(wl_rows):
        try:
            workloads[i] = (str(obj[0]), ms.database.Workload.from_json(obj))
        except Exception:  # a corrupt line (None) or module: count it, keep its index unused
            skipped["corrupt workload lines"] += 1
    for obj in rec_rows:
        try:
            key, wl = workloads[int(obj[0])]
            rec = ms.database.TuningRecord.from_json(obj[1], wl)
        except Exception:
            skipped["corrupt record lines"] += 1
            continue
        yield key, rec


def load_dataset(roots: list[str | os.PathLike], hw: HardwareTarget, *,
                 progress=None) -> Dataset:
    """Read every record under ``roots`` (measured on ``hw``) into a :class:`Dataset`.

    The same (workload, trace) seen in several databases (a verified record is also a
    candidate) counts once.

    Parameters
    ----------
    roots : list of paths
        Log directories, searched recursively for JSONDatabase pairs.
    hw : HardwareTarget
        The hardware the records were measured on (gives the hardware features).
    progress : callable, optional
        Called with a line of text per database read.
    """
    builder = FeatureBuilder(hw)
    rows, counts, lats, keys, srcs = [], [], [], [], []
    skipped: Counter = Counter()
    seen = set()
    for db in find_databases(roots):
        n0 = len(lats)
        for key, rec in _read_database(db, skipped):
            secs = [float(s) for s in rec.run_secs or []]
            if not is_measured(secs):
                skipped["failed measurements"] += 1
                continue
            ident = (key, str(rec.trace))
            if ident in seen:
                skipped["duplicates"] += 1
                continue
            seen.add(ident)
            try:
                cand = rec.as_measure_candidate()  # replays the trace on the workload
                row = builder.rows(rec.workload.mod, [cand])[0]  # (stores x features)
            except Exception:  # a trace from another TVM or schedule rules that no longer applies
                skipped["unreplayable traces"] += 1
                continue
            rows.append(row)
            counts.append(len(row))
            lats.append(sum(secs) / len(secs))
            keys.append(key)
            srcs.append(str(db))
        if progress:
            progress(f"{db}: {len(lats) - n0} candidates")
    width = len(feature_names())
    stores = np.concatenate(rows) if rows else np.zeros((0, width), dtype=np.float32)
    return Dataset(stores=stores, counts=np.array(counts, dtype=np.int64), latency_s=np.array(lats, dtype=np.float64),
                   workload=np.array(keys, dtype=object), source=np.array(srcs, dtype=object),
                   targets=(hw.name,), skipped=dict(skipped))
