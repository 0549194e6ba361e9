"""Tune stage: search schedules for every fused kernel and keep verified records.

Names are imported on first use: tune/ also holds the tuning-log database
(``logdb``, ``logs``) and TVM work-arounds (``fast_import``, ``ms_compat``) that stages
below tune import, and loading this package must not pull the driver in above them.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"RpcOptions": "options", "SearchOptions": "options", "TaskResult": "driver",
            "TuneReport": "driver", "tune": "driver"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
