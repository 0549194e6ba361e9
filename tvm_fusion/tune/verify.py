"""Check a scheduled kernel against its unscheduled reference on random inputs.

Both builds run on the same random contents of every buffer (inputs and outputs alike),
so no knowledge of which parameters are outputs is needed: afterwards every buffer must
agree.
"""

from __future__ import annotations

import numpy as np
import tvm

from ..reference import max_rel_error

KERNEL_RTOL = 1e-4


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


def run_kernel(mod: tvm.IRModule, target: tvm.target.Target, seed: int = 0) -> list[np.ndarray]:
    """Build ``mod``'s ``main`` PrimFunc for ``target`` and run it on seeded random buffers."""
    func = mod["main"]
    lib = tvm.compile(mod, target=target)
    dev = tvm.cpu()
    arrays = [tvm.runtime.tensor(a, dev) for a in _buffers(func, seed)]
    lib["main"](*arrays)
    return [a.numpy() for a in arrays]


class KernelVerifier:
    """Caches each workload's reference outputs and checks candidates against them."""

    def __init__(self, target: tvm.target.Target):
        self.target = target
        self._ref: dict[int, list[np.ndarray]] = {}

    def check(self, key: int, workload: tvm.IRModule, candidate: tvm.IRModule) -> str | None:
        """None when ``candidate`` matches ``workload``; else what went wrong."""
        if key not in self._ref:
            self._ref[key] = run_kernel(workload, self.target)
        try:
            got = run_kernel(candidate, self.target)
        except Exception as e:  # a candidate that does not build or run is a failure
            return f"candidate failed to build or run: {str(e).splitlines()[-1][:300]}"
        for i, (g, w) in enumerate(zip(got, self._ref[key])):
            err = max_rel_error(g, w)
            if not err <= KERNEL_RTOL:
                return f"buffer {i} differs from the reference: max rel error {err:.3g}"
        return None
