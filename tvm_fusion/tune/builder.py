"""MetaSchedule's local builder with one worker pool per process, reused by every batch.

TVM's ``LocalBuilder`` starts a fresh pool of popen workers for every batch it builds,
and one more when it is made (to check that the workers find its build function). Each
worker imports TVM first: 1-2 s of CPU here, twice per batch on two cores. A tuning run
that spreads a small budget over many kernels builds many small batches, so that
start-up cost more than the builds. :class:`PooledBuilder` builds the same way (TVM's
own worker function, our :func:`~tvm_fusion.compat.fast_import.build_kernel`, the same
per-build timeout) in workers that stay up between batches and ``tune()`` calls. TVM
restarts its pool against a slow leak in long-lived workers; here each worker is replaced after
``MAX_USES`` builds, and one that timed out or died (a build that crashed it, a Ctrl-C
that reached the whole process group) is replaced before its next build.
"""

from __future__ import annotations

import atexit
import os
import threading

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func
from tvm.s_tir.meta_schedule.utils import cpu_count
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from ..compat.fast_import import build_kernel

MAX_USES = 64  # builds per worker before it is replaced (TVM's leak guard, amortised)

_pools: dict[tuple[int, int, float], PopenPoolExecutor] = {}
_lock = threading.Lock()


def shared_pool(max_workers: int, timeout_s: float) -> PopenPoolExecutor:
    """This process's builder pool for ``(max_workers, timeout_s)``; its dead workers
    are dropped first, so the next build starts a fresh one in their place."""
    key = (os.getpid(), max_workers, timeout_s)  # a forked child starts its own workers
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            pool = PopenPoolExecutor(max_workers=max_workers, timeout=timeout_s,
                                     maximum_process_uses=MAX_USES)
            _pools[key] = pool
    drop_dead_workers(pool)
    return pool


def drop_dead_workers(pool: PopenPoolExecutor) -> None:
    """Forget ``pool``'s workers whose process has exited, so the next job starts a new
    one (a dead worker would fail its next job with "Subprocess terminated")."""
    with pool._lock:
        for worker in pool._worker_map.values():
            if worker._proc is not None and not worker.is_alive():
                worker.kill()


@atexit.register
def _shutdown() -> None:
    with _lock:
        for (pid, _, _), pool in _pools.items():
            if pid == os.getpid():
                pool.shutdown(wait=False)
        _pools.clear()


@derived_object
class PooledBuilder(ms.builder.PyBuilder):
    """``LocalBuilder(timeout_sec=..., f_build=build_kernel)`` on :func:`shared_pool`.

    Parameters
    ----------
    timeout_sec : float
        Per-build limit; a build past it fails with LocalBuilder's message and its
        worker is replaced.
    max_workers : int, optional
        Parallel builds (default: logical CPUs, as LocalBuilder).
    """

    def __init__(self, *, timeout_sec: float = 60.0, max_workers: int | None = None):
        super().__init__()
        self.timeout_sec = float(timeout_sec)
        self.max_workers = max_workers or cpu_count(logical=True)

    def build(self, build_inputs):
        pool = shared_pool(self.max_workers, self.timeout_sec)
        jobs = [(build_kernel, None, b.mod, b.target, None) for b in build_inputs]
        results = []
        for res in pool.map_with_error_catching(lambda x: _worker_func(*x), jobs):
            if res.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(res.value, None))
            elif res.status == StatusKind.TIMEOUT:
                results.append(ms.builder.BuilderResult(
                    None, f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds"))
            else:
                results.append(ms.builder.BuilderResult(
                    None, "LocalBuilder: An exception occurred\n" + str(res.value)))
        return results
