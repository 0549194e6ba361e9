"""Check a scheduled kernel against its unscheduled reference on random inputs.

Both builds run on the same random contents of every buffer (inputs and outputs alike),
so no knowledge of which parameters are outputs is needed: afterwards every buffer must
agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm

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
        else:  # integer tensors are often indices: 0 is always in range
            out.append(np.zeros(shape, dtype=dtype))
    return out


def run_kernel(mod: tvm.IRModule, target: tvm.target.Target, seeds=VERIFY_SEEDS
               ) -> tuple[list[np.ndarray], float]:
    """Build ``mod``'s ``main`` PrimFunc, run it on seeded random buffers, and time it.

    Returns the buffers after one run per seed (concatenated in seed order) and the
    median time of a run in microseconds.
    """
    func = mod["main"]
    lib = tvm.tirx.build(mod, target=target)
    dev = tvm.cpu()
    outputs = []
    for seed in seeds:
        arrays = [tvm.runtime.tensor(a, dev) for a in _buffers(func, seed)]
        lib["main"](*arrays)
        outputs += [a.numpy() for a in arrays]
    timer = lib.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=10)
    return outputs, float(np.median(timer(*arrays).results)) * 1e6


@dataclass(frozen=True)
class Verdict:
    """Outcome of checking one candidate against its workload's default schedule."""

    error: str | None   # why the candidate is wrong; None when it matches
    candidate_us: float  # both timed side by side in this process
    default_us: float

    @property
    def accepted(self) -> bool:
        """Correct and faster than the default (unscheduled) kernel."""
        return self.error is None and self.candidate_us < self.default_us


class KernelVerifier:
    """Caches each workload's reference run and checks candidates against it."""

    def __init__(self, target: tvm.target.Target):
        self.target = target
        self._ref: dict[int, tuple[list[np.ndarray], float]] = {}

    def check(self, key: int, workload: tvm.IRModule, candidate: tvm.IRModule) -> Verdict:
        """Compare ``candidate`` with the unscheduled ``workload`` (cached under ``key``)."""
        if key not in self._ref:
            self._ref[key] = run_kernel(workload, self.target)
        ref, ref_us = self._ref[key]
        try:
            got, us = run_kernel(candidate, self.target)
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
