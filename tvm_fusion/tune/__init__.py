"""Tune stage: the search. Schedules for every fused kernel, kept as verified records.

:func:`tune` (``driver``) searches each kernel of :func:`tvm_fusion.kernels.prepare_kernels`
in its family's search space (``space``), trials spread by predicted latency share
(``budget``, ``scheduler``); candidates are built (``builder``) and timed (``measure``,
``busy``), checked against the unscheduled kernel (``verify``) and committed to the
tuning logs (``state``); ``predicted`` adds the cost model's picks for kernels the
budget did not reach, ``fallback`` chooses schedules at build time for kernels without a
record. What the search builds on lives in the stages below it: TVM work-arounds in
:mod:`tvm_fusion.compat`, schedule rules in :mod:`tvm_fusion.schedules`, the log store in
:mod:`tvm_fusion.logs`, the kernels to search in :mod:`tvm_fusion.kernels`.

Names are imported on first use, so that importing one module of tune/ does not import
the driver with it.
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
