"""How many trials each task gets: by its share of model latency, with a floor, and when to stop.

Pure functions over plain numbers, so a user can check a split by hand:
``split_budget(100, [7, 2, 1], floor=8) == [70, 20, 10]`` and
``split_budget(100, [18, 1, 1], floor=8) == [84, 8, 8]``.
"""

from __future__ import annotations

import math
from typing import Sequence

# Every open task gets at least this many trials per round ("a few": MetaSchedule's
# first batch of a task is mostly random samples, so fewer says little).
FLOOR_TRIALS = 8
# A task stops early when its best measured latency improved by less than MIN_GAIN over
# its last PATIENCE trials (measurements of one candidate vary by about 1% here).
PATIENCE = 24
MIN_GAIN = 0.01


def latency_shares(weights: Sequence[float], latencies_us: Sequence[float | None]
                   ) -> list[float]:
    """Each task's share of model latency: calls x latency, normalized to sum to 1.

    A task with no latency known yet gets the mean share of the known ones (or an even
    split when none is known), so it is neither starved nor favoured.
    """
    parts = [None if lat is None else float(w) * float(lat)
             for w, lat in zip(weights, latencies_us)]
    known = [p for p in parts if p is not None]
    fill = sum(known) / len(known) if known else 1.0
    parts = [fill if p is None else p for p in parts]
    total = sum(parts)
    if total <= 0:
        return [1.0 / len(parts)] * len(parts) if parts else []
    return [p / total for p in parts]


def split_budget(total: int, shares: Sequence[float], *, floor: int) -> list[int]:
    """Split ``total`` trials over tasks in proportion to ``shares``, each at least ``floor``.

    Water-filling: a task whose proportional share is under the floor gets the floor, and
    the rest is split in proportion over the others, until every task is at or above the
    floor. Whole trials go by largest remainder (ties to the lower index). When
    ``total`` cannot give every task the floor, it is split evenly, the odd trials going
    to the largest shares.

    Parameters
    ----------
    total : int
        Trials to split.
    shares : sequence of float
        Non-negative weights (need not sum to 1); all zero means even.
    floor : int
        Fewest trials per task.

    Returns
    -------
    list of int
        Trials per task, summing to ``total``.
    """
    n = len(shares)
    if n == 0 or total <= 0:
        return [0] * n
    if any(s < 0 or math.isnan(s) for s in shares):
        raise ValueError(f"shares must be non-negative numbers; got {list(shares)}")
    if sum(shares) <= 0:
        shares = [1.0] * n
    order = sorted(range(n), key=lambda i: (-shares[i], i))
    if total < n * floor:
        out = [total // n] * n
        for i in order[:total % n]:
            out[i] += 1
        return out
    fixed: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in fixed]
        left = total - floor * len(fixed)
        mass = sum(shares[i] for i in free)
        want = {i: left * shares[i] / mass if mass > 0 else left / len(free) for i in free}
        low = {i for i in free if want[i] < floor}
        if not low:
            break
        fixed |= low
    out = [floor if i in fixed else math.floor(want[i]) for i in range(n)]
    spare = total - sum(out)
    by_frac = sorted(free, key=lambda i: (-(want[i] - math.floor(want[i])), i))
    for i in by_frac[:spare]:
        out[i] += 1
    return out


def stalled(history: Sequence[float], *, patience: int = PATIENCE,
            min_gain: float = MIN_GAIN) -> bool:
    """True when the last ``patience`` trials improved the best latency by under ``min_gain``.

    Parameters
    ----------
    history : sequence of float
        Best latency so far after each trial, in order (``inf`` before a valid one).
    patience : int
        Trials to look back over.
    min_gain : float
        Relative improvement below which the task is not worth more trials.
    """
    if len(history) <= patience:
        return False
    old, new = history[-patience - 1], history[-1]
    if math.isinf(old):
        return math.isinf(new)  # nothing valid in the whole window either: stalled
    return (old - new) / old < min_gain
