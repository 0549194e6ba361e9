"""How busy the machine is with other work: measurements taken beside it are inflated.

Tuning beside other work commits records that a quiet machine would have rejected: a
candidate and the rule default it is compared with are timed minutes apart, under
different load. AECMOS tuned while a test suite ran on both cores built to 4.26 ms at
16 trials per kernel, slower than its build with no logs (3.42); tuned again on the
quiet machine, 3.21 (benchmarks/RESULTS.md run 21). :func:`other_cores_busy` samples the
kernel's CPU counters around a short sleep and takes this process's own share away.
"""

from __future__ import annotations

import os
import resource
import time

BUSY_CORES = 0.5  # more than half a core of other work: say so before tuning


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat, None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _own_seconds() -> float:
    """CPU seconds of this process and its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def other_cores_busy(seconds: float = 0.3) -> float | None:
    """Cores' worth of CPU time other processes used over ``seconds`` (0 on an idle
    machine, 1.0 for one spinning process); None where /proc/stat cannot be read."""
    before, own0, t0 = _cpu_ticks(), _own_seconds(), time.monotonic()
    time.sleep(seconds)
    after, own1, t1 = _cpu_ticks(), _own_seconds(), time.monotonic()
    if before is None or after is None or after[1] <= before[1]:
        return None
    cores = os.cpu_count() or 1
    busy = (after[0] - before[0]) / (after[1] - before[1]) * cores  # cores in use
    return max(busy - (own1 - own0) / max(t1 - t0, 1e-9), 0.0)


def busy_warning(seconds: float = 0.3) -> str | None:
    """The warning to give before measuring, or None when the machine is quiet enough."""
    busy = other_cores_busy(seconds)
    if busy is None or busy <= BUSY_CORES:
        return None
    return (f"the machine is busy: other processes used {busy:.1f} of its "
            f"{os.cpu_count()} cores just before tuning; measured times are inflated and "
            "vary with that load, so a record may be slower than the rule default it beat "
            "(tune on a quiet machine, or compare the build with `tvm-fusion compile "
            "--no-record rules`)")
