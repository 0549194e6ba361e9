"""Tune stage: search schedules for every fused kernel and keep verified records."""

from .driver import TaskResult, TuneReport, tune

__all__ = ["TaskResult", "TuneReport", "tune"]
