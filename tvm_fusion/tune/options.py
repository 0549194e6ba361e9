"""How :func:`~tvm_fusion.tune` searches and measures: :class:`SearchOptions` and, for
measurement on remote devices, :class:`RpcOptions`.

What a search does, apart from which kernels it tunes (that is
:class:`~tvm_fusion.PlanOptions`), in one frozen value built once by the caller or by
the command line's flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OptionError
from .measure import RUN_TIMEOUT_S

MEASURE_MODES = ("device", "none")
"""Values of ``SearchOptions.measure``: on the target's device, or a dry run."""


def _whole(owner: str, name: str, value, least: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or \
            least is not None and value < least:
        what = "a whole number" + (f" of at least {least}" if least is not None else "")
        raise OptionError(f"{owner}.{name} must be {what}; got {value!r}", field=name,
                          allowed=what)


@dataclass(frozen=True, kw_only=True)
class RpcOptions:
    """Measure on the devices registered at a TVM RPC tracker instead of on this machine.

    Verification of a new best runs there too, so this machine needs no device of the
    target's kind (a GPU target's reference outputs are computed on this machine's CPU).

    Attributes
    ----------
    tracker : str
        ``HOST:PORT`` of the tracker (``python -m tvm.exec.rpc_tracker --host
        127.0.0.1``). It must be on this machine's loopback (a tunnel to a remote one)
        unless ``allow_remote``; that is checked when tuning starts, before any
        connection.
    key : str
        The device key the RPC servers registered with (``python -m
        tvm.exec.rpc_server --tracker HOST:PORT --key KEY``).
    allow_remote : bool
        Measure through a tracker off this machine's loopback. TVM's RPC authenticates
        nobody: any peer that reaches the tracker can register as a device of ``key`` and
        report the times and outputs the logs keep.

    Raises
    ------
    OptionError
        ``tracker`` is not ``HOST:PORT`` or ``key`` is empty.
    """

    tracker: str
    key: str
    allow_remote: bool = False

    def __post_init__(self):
        host, sep, port = str(self.tracker).rpartition(":")
        if not isinstance(self.tracker, str) or not sep or not host or not port.isdigit() \
                or not 0 < int(port) < 65536:
            raise OptionError(f"RpcOptions.tracker must be HOST:PORT (e.g. 127.0.0.1:9190); "
                              f"got {self.tracker!r}", field="tracker", allowed="HOST:PORT")
        if not isinstance(self.key, str) or not self.key:
            raise OptionError(f"RpcOptions.key must be the device key the RPC servers "
                              f"registered with (a non-empty str); got {self.key!r}",
                              field="key", allowed="a non-empty str")
        if not isinstance(self.allow_remote, bool):
            raise OptionError(f"RpcOptions.allow_remote must be True or False; got "
                              f"{self.allow_remote!r}", field="allow_remote",
                              allowed="True, False")


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """How :func:`~tvm_fusion.tune` searches schedules and measures them.

    Attributes
    ----------
    seed : int
        Seed of the search (default 0).
    trials_per_batch : int
        Most candidates measured per task per batch (default 16).
    cost_model : path, PretrainedCostModel, "auto", "none" or None
        A pretrained model (``tvm-fusion cost-model train``) used in place of
        MetaSchedule's XGBoost model and updated with this run's measurements. With it,
        a kernel left without a verified record gets the schedule the model ranks best,
        verified against the default, marked ``predicted``. ``"auto"`` (default): the
        model shipped for this hardware (:func:`tvm_fusion.tune.driver.
        default_cost_model`), else none. ``"none"`` or None: MetaSchedule's XGBoost
        model, from scratch.
    search_space : str, path or SearchSpace, optional
        Schedule space: a family name from ``search_spaces/`` (``cpu``, ``cuda``,
        ``rocm``), a JSON file, or a loaded :class:`~tvm_fusion.tune.space.SearchSpace`.
        None (default): the family's shipped file for LLVM targets, MetaSchedule's
        built-in space for GPUs.
    run_timeout_s : float
        Seconds one candidate may run, its repeats included, before the runner kills it
        (default 30, MetaSchedule's). A schedule that hangs or is hopelessly slow is
        logged to ``rejected.jsonl`` as timed out, counted in the report, and never run
        again.
    measure : str
        ``"device"`` (default): measure candidates on the target's device, here or
        through ``rpc``. ``"none"``: a dry run, for hardware this machine does not have:
        nothing is measured; every kernel without a record gets the schedule
        ``cost_model`` ranks best, checked against the target's limits, and its record
        is marked in the manifest as predicted.
    rpc : RpcOptions, optional
        Measure through a TVM RPC tracker; None (default): on this machine.

    Raises
    ------
    OptionError
        A field with a value it does not take; the message names the field and the
        values it takes.
    """

    seed: int = 0
    trials_per_batch: int = 16
    cost_model: str | Path | Any | None = "auto"
    search_space: str | Path | Any | None = None
    run_timeout_s: float = RUN_TIMEOUT_S
    measure: str = "device"
    rpc: RpcOptions | None = None

    def __post_init__(self):
        _whole("SearchOptions", "seed", self.seed)
        _whole("SearchOptions", "trials_per_batch", self.trials_per_batch, 1)
        t = self.run_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 \
                or not math.isfinite(t):
            raise OptionError(f"SearchOptions.run_timeout_s must be a positive, finite "
                              f"number of seconds; got {t!r}", field="run_timeout_s",
                              allowed="a float > 0")
        if self.measure not in MEASURE_MODES:
            choices = ", ".join(map(repr, MEASURE_MODES))
            raise OptionError(f"SearchOptions.measure must be one of {choices}; got "
                              f"{self.measure!r}", field="measure", allowed=choices)
        if self.rpc is not None and not isinstance(self.rpc, RpcOptions):
            got = repr(self.rpc) if isinstance(self.rpc, str) else type(self.rpc).__name__
            raise OptionError(f"SearchOptions.rpc must be None or an RpcOptions (e.g. "
                              f"RpcOptions(tracker='127.0.0.1:9190', key='cpu0')); got "
                              f"{got}", field="rpc",
                              allowed="None or RpcOptions")
        if isinstance(self.cost_model, bool):
            raise OptionError(f"SearchOptions.cost_model must be 'auto', 'none', None, a "
                              f"model file or a loaded model; got {self.cost_model!r}",
                              field="cost_model",
                              allowed="'auto', 'none', None, a path or a model")
        if isinstance(self.search_space, (bool, int, float)):
            raise OptionError(f"SearchOptions.search_space must be None, a family name "
                              f"(cpu, cuda, rocm), a JSON file or a SearchSpace; got "
                              f"{self.search_space!r}", field="search_space",
                              allowed="None, a family name, a path or a SearchSpace")

    @property
    def dry_run(self) -> bool:
        """Whether nothing is measured (``measure="none"``)."""
        return self.measure == "none"


__all__ = ["MEASURE_MODES", "RpcOptions", "SearchOptions"]
