"""Conv1d probe: Magika's 1-D conv tuned alone, as TVM lays it out (NCHW) and as tvm-fusion does.

Magika (``benchmarks/corpus.py``) convolves 512 positions of 256 channels with 512 filters
of 5 taps: tf2onnx writes it as a 2-D NCHW conv with W = 1. The probe builds that conv's
kernel the two ways the graph stage can legalize it, each with its weight layout-free (as
prepacking marks it), tunes each in the shipped ``search_spaces/cpu.json`` with the GEMM
probe's search (:func:`benchmarks.gemm_probe.tune_best`), checks it against numpy and
times it with the packed weight:

- ``nchw``: ``topi.nn.conv2d_nchw`` on (1, 256, 512, 1), the form before
  ``tvm_fusion.simplify.line_convs``; the output's last axis is the unit W;
- ``nhwc``: ``topi.nn.conv2d_nhwc`` on (1, 512, 1, 256) with an HWIO weight, the form
  after it: the output channels are the last axis, in vector lanes.

``python -m benchmarks.conv1d_probe [--trials 16] [--forms nchw,nhwc] [--conv C,O,L,K]
[--peak-gflops F]`` prints time, GFLOP/s and the share of the fp32 FMA peak (by default
the one ``tvm-fusion calibrate`` measured for the host's target description). ``--conv``
probes another 1-D conv: C input channels, O filters, L positions, K taps (PP-OCRv4 rec's
moved 1 x 1 conv over 40 positions: ``--conv 120,480,40,1``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from benchmarks.gemm_probe import tune_best, tvm_time

MAGIKA = (256, 512, 512, 5)  # input channels, filters, positions, taps


def kernel(form: str, shape=MAGIKA):
    """The conv's PrimFunc in ``form`` (nchw or nhwc), its weight layout-free."""
    import tvm
    from tvm import te, topi

    C, O, L, K = shape
    if form == "nchw":
        x = te.placeholder((1, C, L, 1), name="x")
        w = te.placeholder((O, C, K, 1), name="w")
        y = topi.nn.conv2d_nchw(x, w, 1, 0, 1)
    else:
        x = te.placeholder((1, L, 1, C), name="x")
        w = te.placeholder((K, 1, C, O), name="w")
        y = topi.nn.conv2d_nhwc(x, w, 1, 0, 1)
    func = te.create_prim_func([x, w, y]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func.with_attr("layout_free_buffers", [1])})


def rel_error(mod, form: str, target, shape=MAGIKA) -> float:
    """Max relative error of the tuned kernel (packing included) against numpy."""
    import tvm

    C, O, L, K = shape
    rng = np.random.default_rng(1)
    x = rng.standard_normal((C, L), dtype=np.float32)
    w = rng.standard_normal((O, C, K), dtype=np.float32)
    want = sum(np.einsum("oc,cl->ol", w[:, :, k], x[:, k:L - K + 1 + k]) for k in range(K))
    if form == "nchw":
        args, want = [x[None, :, :, None], w[..., None]], want[None, :, :, None]
    else:
        args = [x.T[None, :, None, :], w.transpose(2, 1, 0)[:, None]]
        want = want.T[None, :, None, :]
    out = tvm.runtime.tensor(np.zeros(want.shape, np.float32))
    tvm.tirx.build(mod, target=target)(*[tvm.runtime.tensor(np.ascontiguousarray(a))
                                         for a in args], out)
    return float(np.abs(out.numpy() - want).max() / np.abs(want).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--forms", default="nchw,nhwc")
    ap.add_argument("--conv", default=",".join(map(str, MAGIKA)), help="C,O,L,K")
    ap.add_argument("--peak-gflops", type=float, default=None,
                    help="fp32 FMA peak (default: the host target description's)")
    args = ap.parse_args(argv)
    import tvm

    from tvm_fusion.targets import load_target
    from tvm_fusion.tune.fast_import import import_tensor_intrinsics
    from tvm_fusion.tune.space import load_search_space

    shape = tuple(int(v) for v in args.conv.split(","))
    C, O, L, K = shape
    flops = 2.0 * O * C * K * (L - K + 1)
    import_tensor_intrinsics()
    host = load_target("host")
    target = host.tvm_target()
    peak = args.peak_gflops or host.peak_flops["fp32_vector"] / 1e9
    print(f"threads {tvm.get_global_func('runtime.NumThreads')()}, load {os.getloadavg()}, "
          f"peak {peak:.1f} GFLOP/s")
    for form in args.forms.split(","):
        with tempfile.TemporaryDirectory(prefix="conv1d-probe-") as wd:
            best, tags, _, _ = tune_best(kernel(form, shape), target,
                                         load_search_space("cpu"), args.trials, args.seed, wd)
        t = min(tvm_time(best, target) for _ in range(3))
        rate = flops / t / 1e9
        print(f"{form} {shape}: {t * 1e3:.3f} ms, {rate:.0f} GFLOP/s ({rate / peak:.0%} of "
              f"peak), rel err {rel_error(best, form, target, shape):.1e}, best: {tags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
