"""Check a scheduled kernel against its unscheduled reference on random inputs.

Both builds run on the same random contents of every buffer (inputs and outputs alike),
so no knowledge of which parameters are outputs is needed: afterwards every buffer must
agree.

Where the candidate runs: on this machine, or on a device behind an RPC tracker
(:class:`~tvm_fusion.tune.measure.RemoteDevice`), the same path as measurement. A GPU
kernel's reference is the unscheduled kernel built for this machine's CPU (GPU code needs
bound threads, which the unscheduled kernel has none of), and the default it must beat
is dlight's schedule of it on the device, which is what ``compile`` would otherwise use.
"""

from __future__ import annotations

import contextlib
import enum
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm

from ..gpu.schedule import default_schedule
from ..reference import max_rel_error

KERNEL_RTOL = 1e-4
# Several draws: one seed let a kernel 5e-4 off through at 5e-5 (PP-OCR rec, a fused
# conv+BN+swish+concat whose error then grew to 0.27 at the model output).
VERIFY_SEEDS = (0, 1, 2)


def _buffers(func: tvm.tirx.PrimFunc, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for buf in func.params:  # in TVM 0.27 a PrimFunc's params are its buffers
        shape = [int(d) for d in buf.shape]
        dtype = str(buf.dtype)
        if dtype.startswith("float"):
            out.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "bool":
            out.append(rng.integers(0, 2, shape).astype(bool))
        elif dtype in ("int8", "uint8"):  # quantized data, never indices: any value
            out.append(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape,
                                    dtype=dtype))
        else:  # integer tensors are often indices: 0 is always in range
            out.append(np.zeros(shape, dtype=dtype))
    return out


@contextlib.contextmanager
def _loaded(lib, target: tvm.target.Target, remote):
    """``(module, device)`` of a built kernel: here, or uploaded to an RPC server."""
    kind = {"llvm": "cpu"}.get(str(target.kind.name), str(target.kind.name))
    if remote is None:
        yield lib, tvm.device(kind, 0)
        return
    with tempfile.TemporaryDirectory(prefix="tvm-fusion-verify-") as tmp, \
            remote.session() as sess:
        path = Path(tmp) / "kernel.so"
        lib.export_library(str(path))
        sess.upload(str(path))
        yield sess.load_module(path.name), sess.device(kind, 0)


def run_kernel(mod: tvm.IRModule, target: tvm.target.Target, seeds=VERIFY_SEEDS, *,
               remote=None) -> tuple[list[np.ndarray], float]:
    """Build ``mod``'s ``main`` PrimFunc, run it on seeded random buffers, and time it.

    Parameters
    ----------
    mod : tvm.IRModule
    target : tvm.target.Target
    seeds : sequence of int
    remote : tvm_fusion.tune.measure.RemoteDevice, optional
        Run on a device behind an RPC tracker instead of this machine.

    Returns
    -------
    (list of numpy.ndarray, float)
        The buffers after one run per seed (concatenated in seed order) and the median
        time of a run in microseconds.
    """
    func = mod["main"]
    lib = tvm.tirx.build(mod, target=target)
    outputs = []
    with _loaded(lib, target, remote) as (rlib, dev):
        for seed in seeds:
            arrays = [tvm.runtime.tensor(a, dev) for a in _buffers(func, seed)]
            rlib["main"](*arrays)
            outputs += [a.numpy() for a in arrays]
        timer = rlib.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=10)
        return outputs, float(np.median(timer(*arrays).results)) * 1e6


def reference_run(mod: tvm.IRModule, target: tvm.target.Target, *, remote=None, hw=None
                  ) -> tuple[list[np.ndarray], float]:
    """The reference outputs of an unscheduled kernel and the default schedule's time.

    On a CPU target both come from one run of the unscheduled kernel, but the time of a
    kernel whose default is scheduled (an int8 GEMM on VNNI) from that schedule. On a GPU target
    the outputs come from the unscheduled kernel on this machine's CPU, and the time
    from the default schedule ``compile`` would use (``gpu.schedule.default_schedule``,
    within ``hw``'s limits) on the device.
    """
    if str(target.kind.name) == "llvm":
        ref, default_us = run_kernel(mod, target, remote=remote)
        scheduled = default_schedule(mod, target, hw)
        if scheduled is not mod:  # an int8 GEMM's default is VNNI, not the loops
            _, default_us = run_kernel(scheduled, target, seeds=(0,), remote=remote)
        return ref, default_us
    ref, _ = run_kernel(mod, tvm.target.Target("llvm"))
    _, default_us = run_kernel(default_schedule(mod, target, hw), target, seeds=(0,),
                               remote=remote)
    return ref, default_us


class Outcome(enum.Enum):
    """What tuning does with a checked candidate."""

    ACCEPTED = "correct and faster than the default: committed"
    NOT_FASTER = "correct but not faster than the default loops: the default stays"
    WRONG = "wrong, or fails to build or run: logged to rejected.jsonl"


@dataclass(frozen=True)
class Verdict:
    """Outcome of checking one candidate against its workload's default schedule."""

    error: str | None   # why the candidate is wrong; None when it matches
    candidate_us: float | None  # both timed side by side in this process (None: not run)
    default_us: float | None

    @classmethod
    def untimed(cls, error: str | None) -> "Verdict":
        """A candidate checked without its device (built, within the target's limits)."""
        return cls(error, None, None)

    @property
    def outcome(self) -> Outcome:
        if self.error is not None:
            return Outcome.WRONG
        if self.candidate_us is None or self.candidate_us < self.default_us:
            return Outcome.ACCEPTED
        return Outcome.NOT_FASTER

    @property
    def accepted(self) -> bool:
        """Correct and faster than the default (unscheduled) kernel."""
        return self.outcome is Outcome.ACCEPTED

    @property
    def note(self) -> str:
        """Why it was not accepted ("" when it was)."""
        if self.outcome is Outcome.NOT_FASTER:
            return "correct but not faster than the default loops"
        return self.error or ""


class KernelVerifier:
    """Caches each workload's reference run and checks candidates against it."""

    def __init__(self, target: tvm.target.Target, remote=None, hw=None):
        self.target = target
        self.remote = remote  # a RemoteDevice: candidates run behind the RPC tracker
        self.hw = hw  # the HardwareTarget: the default schedule keeps within its limits
        self._ref: dict[int, tuple[list[np.ndarray], float]] = {}

    def reference(self, key: int, workload: tvm.IRModule) -> tuple[list[np.ndarray], float]:
        """``workload``'s reference buffers and default time, computed once per ``key``."""
        if key not in self._ref:
            self._ref[key] = reference_run(workload, self.target, remote=self.remote,
                                           hw=self.hw)
        return self._ref[key]

    def check(self, key: int, workload: tvm.IRModule, candidate: tvm.IRModule) -> Verdict:
        """Compare ``candidate`` with the unscheduled ``workload`` (cached under ``key``)."""
        ref, ref_us = self.reference(key, workload)
        try:
            got, us = run_kernel(candidate, self.target, remote=self.remote)
        except Exception as e:  # a candidate that does not build or run is a failure
            msg = f"candidate failed to build or run: {str(e).splitlines()[-1][:300]}"
            return Verdict(msg, float("inf"), ref_us)
        nbuf = len(workload["main"].params)
        for i, (g, w) in enumerate(zip(got, ref)):
            err = max_rel_error(g, w)
            if not err <= KERNEL_RTOL:
                draw, buf = divmod(i, nbuf)
                return Verdict(f"buffer {buf} differs from the reference on random draw "
                               f"{draw}: max rel error {err:.3g}", us, ref_us)
        return Verdict(None, us, ref_us)
