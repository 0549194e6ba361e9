"""Measurement: the local runner or TVM's RPC tracker, repeats, median and spread, re-measuring.

Every candidate is timed ``REPEAT`` times (each repeat at least ``MIN_REPEAT_MS``); its
record's ``run_secs`` keeps all repeats, so a reader gets the median and the spread.
Near-ties with a task's best are measured again, interleaved with the incumbent, before
the candidate may replace it (:func:`remeasure`).

Nothing here listens on a socket: the local runner and builder talk to their worker
processes through pipes. With ``--rpc-tracker`` the tuner connects out to a TVM RPC
tracker, which authenticates nobody, so a tracker off this machine's loopback is
refused unless ``allow_remote`` (``--rpc-allow-remote``) says the network is trusted
(:func:`check_tracker_host`); and times a device reports are used only when they are
finite and positive (:func:`valid_secs`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import socket
import statistics
from typing import Sequence

import tvm
from tvm import rpc
from tvm.s_tir import meta_schedule as ms

from ..errors import TvmFusionError
from ..family import family_of

REPEAT = 5
MIN_REPEAT_MS = 10
# Seconds one candidate may run (its repeats included) before the runner kills its worker
# process: MetaSchedule's default. A hanging or hopelessly slow schedule is recorded as
# timed out (``rejected.jsonl``) and never measured again; the next one gets a new worker.
RUN_TIMEOUT_S = 30.0
TIMEOUT_MARK = "Timeout"  # in the error of a run LocalRunner / RPCRunner killed
NEAR_TIE = 0.03  # a candidate within 3% of the best is measured again before it wins
REMEASURE_ROUNDS = 2


class MeasureError(TvmFusionError):
    """The measurement back end (local or RPC tracker) cannot be used as asked."""


def evaluator_config() -> ms.runner.EvaluatorConfig:
    """Several repeats per candidate, so each measurement has a median and a spread."""
    return ms.runner.EvaluatorConfig(number=1, repeat=REPEAT, min_repeat_ms=MIN_REPEAT_MS,
                                     enable_cpu_cache_flush=False)


def median_us(run_secs: Sequence) -> float:
    """Median of a record's repeats, in microseconds."""
    return statistics.median(float(s) for s in run_secs) * 1e6


def spread_pct(run_secs: Sequence) -> float:
    """(max - min) / median of the repeats, in percent; 0 for a single repeat."""
    secs = [float(s) for s in run_secs]
    med = statistics.median(secs)
    return (max(secs) - min(secs)) / med * 100 if med > 0 else 0.0


def device_type(target) -> str:
    """The runner's device name of a target (``llvm`` kernels run on the ``cpu``)."""
    return family_of(target).device_type


def check_local_device(target, name: str) -> None:
    """Refuse to tune for a device this machine does not have.

    Candidates may be measured remotely, but every new best is verified here against
    the unscheduled kernel, so the device must be present on this machine. Without
    this check a GPU tune on a CPU-only machine measured nothing and said "untuned".
    """
    if family_of(target).host_cpu:
        return
    kind = device_type(target)
    if not tvm.device(kind, 0).exist:
        raise MeasureError(
            f"tuning for target {name} measures and verifies kernels on a {kind} device, "
            f"and this machine has none (tvm.device({kind!r}, 0).exist is False). Tune on "
            f"a machine with that GPU, or measure on it through --rpc-tracker; here, "
            f"`tune --dry-run` picks schedules by the cost model alone, and `plan` and "
            f"`compile` work for {name} (kernels without a record get default schedules)")


def parse_tracker(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), with a clear error for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MeasureError(f"--rpc-tracker must be HOST:PORT (e.g. 127.0.0.1:9190); got {text!r}")
    return host, int(port)


def valid_secs(run_secs: Sequence) -> bool:
    """Whether a measurement's repeats are times at all: some, each finite and positive.

    A remote device reports its own numbers; a NaN, a negative or a zero time would win
    every comparison (or none) and be written to the logs as the kernel's best."""
    try:
        secs = [float(s) for s in run_secs]
    except (TypeError, ValueError):
        return False
    return bool(secs) and all(math.isfinite(s) and s > 0 for s in secs)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (127.0.0.0/8, ::1, ``localhost``):
    an address literal is checked as it is, a name by every address it resolves to."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host.lower() == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


REMOTE_WARNING = (
    "A TVM RPC tracker and its servers authenticate nobody: whoever reaches the tracker "
    "can register a server under your key, receive every kernel built for measurement, "
    "and report any time or output (so choose which schedules the logs keep), and an "
    "rpc_server runs any library anyone who reaches its port uploads")


def check_tracker_host(host: str, port: int, *, allow_remote: bool = False) -> None:
    """Refuse a tracker that is not on this machine's loopback unless ``allow_remote``.

    Raises
    ------
    MeasureError
        ``host`` is not a loopback address and ``allow_remote`` is False. No connection
        is made before this check.
    """
    if allow_remote or is_loopback(host):
        return
    raise MeasureError(
        f"--rpc-tracker {host}:{port} is not on this machine's loopback, and measuring "
        f"through it is refused by default. {REMOTE_WARNING}. Reach the tracker through a "
        f"tunnel to this machine's loopback (`ssh -N -L {port}:127.0.0.1:{port} "
        f"USER@{host}`, then --rpc-tracker 127.0.0.1:{port}), or pass --rpc-allow-remote "
        f"if every machine that can reach {host}:{port} is trusted")


def check_tracker(host: str, port: int, key: str, *, timeout_s: float = 10.0) -> int:
    """How many RPC servers of ``key`` are free at the tracker; errors when none can be used.

    Raises
    ------
    MeasureError
        The tracker does not answer, or no server of ``key`` is registered or free.
    """
    where = f"{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise MeasureError(
            f"cannot reach the RPC tracker at {where} ({e}). Start one with `python -m "
            f"tvm.exec.rpc_tracker --host {host} --port {port}` (TVM's default --host "
            f"0.0.0.0 listens on every network), or fix --rpc-tracker") from e
    try:
        session = rpc.connect_tracker(host, port)
        session._sock.settimeout(timeout_s)  # a port that is no tracker must not hang us
        summary = session.summary()
        session.close()
    except Exception as e:  # TVM's RPC raises plain errors; anything here means no tracker
        raise MeasureError(f"{where} does not answer as a TVM RPC tracker: {e}") from e
    keys = sorted({s["key"].split(":", 1)[-1] for s in summary.get("server_info", [])})
    registered = sum(1 for s in summary.get("server_info", [])
                     if s["key"].split(":", 1)[-1] == key)
    queue = summary.get("queue_info", {}).get(key, {})
    free = int(queue.get("free", 0))
    if registered == 0 and free == 0:
        raise MeasureError(
            f"no RPC server with key {key!r} is registered at the tracker {where} (keys "
            f"there: {keys or 'none'}). Start one on the device with `python -m "
            f"tvm.exec.rpc_server --host 127.0.0.1 --tracker {where} --key {key}` (the "
            f"address it listens on: TVM's default, 0.0.0.0, runs any library anyone on "
            f"the network uploads), or fix --rpc-key")
    if free == 0:
        raise MeasureError(
            f"all {registered} RPC server(s) with key {key!r} at {where} are busy "
            f"({queue.get('pending', 0)} requests waiting); wait for them or add servers")
    return free


class RemoteDevice:
    """A device behind a TVM RPC tracker, for runs outside MetaSchedule's runner.

    Verification of a new best runs through it, so a tuning machine needs no device of
    its own. Each :meth:`session` is requested and closed around one use, so it never
    holds a server the runner is waiting for.
    """

    def __init__(self, tracker: str, key: str, *, timeout_s: int = 120):
        self.host, self.port = parse_tracker(tracker)
        self.key, self.timeout_s = key, timeout_s

    @contextlib.contextmanager
    def session(self):
        """An RPC session on one free server of ``key``; closed on exit."""
        try:
            sess = rpc.connect_tracker(self.host, self.port).request(
                self.key, priority=0, session_timeout=self.timeout_s)
        except Exception as e:  # TVM's RPC raises plain errors
            raise MeasureError(f"no RPC session for key {self.key!r} from the tracker "
                               f"{self.host}:{self.port}: {str(e).splitlines()[-1]}") from e
        try:
            yield sess
        finally:
            sess._sess = None  # drop the remote handle: the server frees itself


def make_runner(*, rpc_tracker: str | None = None, rpc_key: str | None = None,
                session_timeout_s: int = 60, allow_remote: bool = False,
                timeout_s: float = RUN_TIMEOUT_S) -> ms.runner.Runner:
    """The local runner, or an RPC runner through ``rpc_tracker`` for devices of ``rpc_key``
    (on this machine's loopback unless ``allow_remote``: :func:`check_tracker_host`).

    ``timeout_s``: seconds one candidate may run before it is killed (locally: its worker
    process; over RPC: its session, at least ``session_timeout_s``)."""
    if not timeout_s > 0:
        raise MeasureError(f"the run timeout must be a positive number of seconds, "
                           f"got {timeout_s}")
    if (rpc_tracker is None) != (rpc_key is None):
        raise MeasureError("--rpc-tracker and --rpc-key go together: give both to measure on "
                           "remote devices, or neither to measure on this machine")
    if rpc_tracker is None:
        return local_runner(timeout_s)
    host, port = parse_tracker(rpc_tracker)
    check_tracker_host(host, port, allow_remote=allow_remote)
    free = check_tracker(host, port, rpc_key)
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=rpc_key,
                                 session_priority=1,
                                 session_timeout_sec=max(session_timeout_s, math.ceil(timeout_s)))
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator_config(),
                               max_workers=free)


_local: dict[tuple[int, float], ms.runner.LocalRunner] = {}


def local_runner(timeout_s: float = RUN_TIMEOUT_S) -> ms.runner.LocalRunner:
    """This process's local runner for ``timeout_s``, made once: its one worker process
    stays up between ``tune()`` calls (a new one imports TVM first, seconds here); a
    worker that died or was killed for a timeout is replaced before the next
    measurement, and a forked child makes its own."""
    from .builder import drop_dead_workers

    key = (os.getpid(), float(timeout_s))
    runner = _local.get(key)
    if runner is None:
        runner = _local[key] = ms.runner.LocalRunner(timeout_sec=float(timeout_s),
                                                     evaluator_config=evaluator_config())
    drop_dead_workers(runner.pool)
    return runner


def remeasure(runner: ms.runner.Runner, device_type: str, items: Sequence[tuple[str, list]],
              rounds: int = REMEASURE_ROUNDS) -> list[list[float]]:
    """Time each built artifact ``rounds`` more times, interleaved, through ``runner``.

    ``items`` are ``(artifact_path, args_info)``; returns the repeats (seconds) of each,
    empty for one that failed.
    """
    inputs = [ms.runner.RunnerInput(path, device_type, args)
              for _ in range(rounds) for path, args in items]
    out: list[list[float]] = [[] for _ in items]
    for k, fut in enumerate(runner.run(inputs)):
        res = fut.result()
        if res.error_msg is None and valid_secs(res.run_secs):
            out[k % len(items)] += [float(s) for s in res.run_secs]
    return out
