"""The tuner's builder: batches share one worker per slot, and a dead worker is replaced."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tvm_fusion.tune.builder import PooledBuilder, shared_pool


def _inputs():
    a = te.placeholder((64,), name="A")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="B")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    return [ms.builder.BuilderInput(mod, tvm.target.Target({"kind": "llvm"}))]


def _built(results) -> Path:
    (res,) = results
    assert res.error_msg is None, res.error_msg
    path = Path(res.artifact_path)
    assert path.is_file() and path.stat().st_size > 0
    shutil.rmtree(path.parent)
    return path


def test_batches_reuse_the_worker_and_a_killed_worker_is_replaced():
    # a timeout no other test uses: this pool is the test's own
    builder = PooledBuilder(timeout_sec=61, max_workers=1)
    _built(builder.build(_inputs()))
    (worker,) = shared_pool(1, 61.0)._worker_map.values()
    pid = worker._proc.pid
    # the next batch, from another builder object (another tune() call), same process
    _built(PooledBuilder(timeout_sec=61, max_workers=1).build(_inputs()))
    assert worker._proc.pid == pid
    # killed between batches (a Ctrl-C reaches the whole process group): the next batch
    # gets a new worker instead of failing with "Subprocess terminated"
    os.kill(pid, signal.SIGKILL)
    worker._proc.wait(timeout=30)
    _built(builder.build(_inputs()))
    assert worker._proc.pid != pid
