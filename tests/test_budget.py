"""The budget split by share of model latency, its floor, and early stopping (pure numbers)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from tvm_fusion.tune.budget import FLOOR_TRIALS, latency_shares, split_budget, stalled
from tvm_fusion.tune.driver import _allot


def test_split_is_proportional_when_every_share_clears_the_floor():
    assert split_budget(100, [7, 2, 1], floor=8) == [70, 20, 10]
    assert split_budget(100, [0.7, 0.2, 0.1], floor=8) == [70, 20, 10]


def test_floor_is_water_filled():
    # 90/5/5 would leave two tasks under the floor: they get 8 each, the rest the 84 left.
    assert split_budget(100, [18, 1, 1], floor=8) == [84, 8, 8]
    # Fixing one task at the floor can push another under it: 47.2 / 8.03 / 4.7 fixes
    # the third; 52 over 10 : 1.7 gives the second 7.56, under the floor too.
    assert split_budget(60, [10, 1.7, 1], floor=8) == [44, 8, 8]


def test_whole_trials_go_by_largest_remainder():
    # 10 * (1/3, 1/3, 1/3) = 3.33 each: the odd trial goes to the first.
    assert split_budget(10, [1, 1, 1], floor=1) == [4, 3, 3]
    # 10 * (0.55, 0.45) = 5.5 / 4.5: ties of the fraction go to the lower index.
    assert split_budget(10, [0.55, 0.45], floor=1) == [6, 4]


def test_budget_below_the_floors_is_split_evenly_largest_first():
    assert split_budget(10, [5, 1, 1, 1], floor=8) == [3, 3, 2, 2]
    assert split_budget(3, [1, 5, 2, 1], floor=8) == [1, 1, 1, 0]


def test_degenerate_inputs():
    assert split_budget(50, [0, 0, 0], floor=8) == [17, 17, 16]
    assert split_budget(0, [1, 2], floor=8) == [0, 0]
    assert split_budget(5, [], floor=8) == []
    with pytest.raises(ValueError, match="non-negative"):
        split_budget(10, [1, -1], floor=1)


@pytest.mark.parametrize("total", [7, 40, 99, 1000])
def test_split_always_sums_to_the_total_and_keeps_the_floor(total):
    shares = [0.5, 0.01, 0.3, 0.0, 0.19]
    out = split_budget(total, shares, floor=4)
    assert sum(out) == total
    if total >= 4 * len(shares):
        assert min(out) >= 4


def test_latency_shares_weight_calls_times_latency():
    # 1 call x 300 us, 2 calls x 100 us, 1 call x 100 us: 300 : 200 : 100.
    assert latency_shares([1, 2, 1], [300, 100, 100]) == pytest.approx([0.5, 1 / 3, 1 / 6])
    # unknown latency: the mean of the known parts (300 and 100 -> 200)
    assert latency_shares([1, 1, 1], [300, 100, None]) == pytest.approx([0.5, 1 / 6, 1 / 3])
    assert latency_shares([1, 1], [None, None]) == [0.5, 0.5]


def test_stalled_looks_at_the_last_patience_trials():
    flat = [100.0, 90.0] + [89.5] * 24
    assert stalled(flat, patience=24, min_gain=0.01)  # 90 -> 89.5 is 0.6%
    improving = [100.0] + [100 - k for k in range(1, 25)]
    assert not stalled(improving, patience=24, min_gain=0.01)
    assert not stalled([100.0] * 24, patience=24)  # too few trials to judge
    assert stalled([math.inf] * 30, patience=24)  # nothing ran in the whole window
    assert not stalled([math.inf] * 10 + [50.0] * 20, patience=24)  # first valid inside


def test_driver_allots_whole_batches_by_latency_share():
    # Three tasks of one call each at 600, 300 and 100 us; 64 trials in batches of 8.
    lat = {0: 600.0, 1: 300.0, 2: 100.0}
    state = SimpleNamespace(tasks=[SimpleNamespace(weight=1)] * 3, latency_us=lat.get)
    allot, batch = _allot(state, [0, 1, 2], 64, per_batch=16)
    assert batch == FLOOR_TRIALS == 8
    # 8 batches: 4.8 / 2.4 / 0.8 -> the floor of 1 batch for the last, 7 split 4.67 / 2.33
    assert allot == {0: 40, 1: 16, 2: 8}
    # 20 trials over 3 tasks: batches of 6, 3 units split 1/1/1, the odd 2 to the largest
    allot, batch = _allot(state, [0, 1, 2], 20, per_batch=16)
    assert batch == 6 and allot == {0: 8, 1: 6, 2: 6}
