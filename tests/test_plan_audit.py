"""benchmarks/plan_audit.py: where plans differ between targets, each difference priced
on both targets and judged against the measured error (planning only, no tuning)."""

from __future__ import annotations

import pytest

from benchmarks.plan_audit import audit, regions

from test_planner import depthwise_hardswish_pool

GPU_ERROR = 1.0685  # planner_accuracy on tuning_logs/h200


def test_regions_pair_the_kernels_that_split_the_same_operators_differently():
    a = [{0, 1}, {2}, {3, 4}, {5}, {6, 7}]
    b = [{0}, {1, 2}, {3, 4}, {5, 6}, {7}]
    got = regions(a, b)
    assert [(sorted(map(sorted, ra)), sorted(map(sorted, rb))) for ra, rb in got] == [
        ([[0, 1], [2]], [[0], [1, 2]]), ([[5], [6, 7]], [[5, 6], [7]])]
    assert regions(a, a) == []


@pytest.fixture(scope="module")
def dw_audit():
    return audit(depthwise_hardswish_pool(), ["x86_avx2", "a100", "mi250x"],
                 cpu_error=1.74, gpu_error=GPU_ERROR, name="dwhsp")


def test_no_target_decides_a_difference_inside_the_measured_error_against_fuseops(dw_audit):
    """The HardSwish chain goes into the conv or into the pool: 0.03 us apart on A100 and
    MI250X, so a tie there, FuseOps' choice; the plans agree with x86's or differ by more
    than the error."""
    assert set(dw_audit["decisions"]) == {"x86_avx2", "a100", "mi250x"}
    for diff in dw_audit["differences"]:
        for view in diff.get("views", ()):
            assert not view["not_a_tie"], (diff, view)
            assert view["own_us"] > 0 and view["other_us"] > 0
            assert view["band_us"] >= 0 and view["margin_us"] > 0
    notes = {tuple(d["targets"]): d.get("note") for d in dw_audit["differences"]}
    assert notes[("a100", "mi250x")] == "the same kernels"  # both make FuseOps' choice
