"""Interleaved timing: every system is timed once per round, for several rounds.

The machine is shared and noisy, so no system gets one long uninterrupted stretch:
each round times every system for ``slot_s`` (after a short warm-up that also lets the
previous system's spinning worker threads go idle), the order rotating from round to
round, and the statistics are taken over all the calls of all rounds. Every call is
timed alone with ``perf_counter`` from Python, so each system pays its own Python
entry cost (``InferenceSession.run``, ``VirtualMachine`` call, ``nn.Module`` call),
which matters only for models that run in a few microseconds.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field


@dataclass
class Row:
    """One system of one model, as :func:`interleave` times it.

    Attributes
    ----------
    model, system : str
        What is timed, for the table.
    call : callable or None
        One inference; a row without it is not timed.
    times_ms : list of float
        Every timed call, filled by :func:`interleave`.
    info : dict
        Anything else the table reports (trials, kernels, errors).
    """

    model: str
    system: str
    call: object = None
    times_ms: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


def interleave(rows, *, rounds: int = 5, slot_s: float = 0.3, warmup_s: float = 0.05,
               min_calls: int = 3, gap_s: float = 0.05, log=print) -> None:
    """Fill ``row.times_ms`` of every row whose ``call`` is set."""
    timed = [r for r in rows if r.call is not None]
    if not timed:
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        for k in range(rounds):
            shift = k % len(timed)
            for row in timed[shift:] + timed[:shift]:
                time.sleep(gap_s)
                end = time.perf_counter() + warmup_s
                row.call()
                while time.perf_counter() < end:
                    row.call()
                n, end = 0, time.perf_counter() + slot_s
                while True:
                    t0 = time.perf_counter()
                    row.call()
                    t1 = time.perf_counter()
                    row.times_ms.append((t1 - t0) * 1e3)
                    n += 1
                    if n >= min_calls and t1 >= end:
                        break
            gc.collect()
            log(f"  timing round {k + 1}/{rounds} done")
    finally:
        if enabled:
            gc.enable()
