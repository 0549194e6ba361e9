"""float32 exp on CPU builds: a vectorizable polynomial inside ``vectorizable_exp``, TVM's
own lowering (libm, one call per lane) outside it."""

import numpy as np
import pytest
import tvm
from tvm import te, topi

from tvm_fusion.compat.fast_math import exp_lowerings, vectorizable_exp

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def _exp_kernel(n: int) -> tvm.IRModule:
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: te.exp(x[i]), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def _run(lib, *arrays):
    dev = tvm.cpu()
    bufs = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib(*bufs)
    return bufs[-1].numpy()


def _llvm_ir(lib) -> str:
    return lib.inspect_source("ll") if hasattr(lib, "inspect_source") else lib.get_source("ll")


def test_fast_exp_matches_float64_exp_over_float32_range():
    vals = np.concatenate([np.linspace(-87, 88.3, 4001, dtype="float32"),
                           np.array([0.0, 1e-8, -1e-8, 0.5, -0.5], "float32")])
    with vectorizable_exp():
        lib = tvm.tirx.build(_exp_kernel(vals.size), target=TARGET)
    got = _run(lib, vals, np.zeros_like(vals))
    want = np.exp(vals.astype("float64"))
    rel = np.abs(got - want) / want
    assert rel.max() < 2e-7, (rel.max(), vals[rel.argmax()])  # numpy float32: 1.9e-7


def test_fast_exp_limits():
    vals = np.array([-np.inf, -1e4, -100.0, 100.0, np.inf], "float32")
    with vectorizable_exp():
        lib = tvm.tirx.build(_exp_kernel(vals.size), target=TARGET)
    got = _run(lib, vals, np.zeros_like(vals))
    assert got[0] == 0.0 and got[1] == 0.0 and got[2] < 1e-38  # underflows, never negative
    assert got[3] > 1e38 and np.isinf(got[4])  # clamped at float32's range; inf stays inf


def test_only_builds_inside_the_block_take_the_polynomial():
    mod = _exp_kernel(64)
    rule = tvm.ir.Op.get("tirx.exp").get_attr("llvm.FLowerIntrinsic")
    plain = _llvm_ir(tvm.tirx.build(mod, target=TARGET))
    before = exp_lowerings()
    with vectorizable_exp(fast=False):
        counted = _llvm_ir(tvm.tirx.build(mod, target=TARGET))
    assert exp_lowerings() > before  # the build lowered an exponential (libm's)
    with vectorizable_exp():
        with vectorizable_exp(fast=False):  # the innermost block decides
            inner = _llvm_ir(tvm.tirx.build(mod, target=TARGET))
        fast = _llvm_ir(tvm.tirx.build(mod, target=TARGET))
    assert "@llvm.exp" in plain  # TVM's own rule, as in a process without tvm_fusion
    assert "@llvm.exp" in counted and "@llvm.exp" in inner
    assert "@llvm.exp" not in fast
    # TVM's rule is back, the same function object, once the last block closed
    assert tvm.ir.Op.get("tirx.exp").get_attr("llvm.FLowerIntrinsic").same_as(rule)
    # a kernel without exp is not counted
    x = te.placeholder((8,), "float32", name="x")
    before = exp_lowerings()
    with vectorizable_exp(fast=False):
        tvm.tirx.build(tvm.IRModule({"main": te.create_prim_func([x, topi.abs(x)])}),
                       target=TARGET)
    assert exp_lowerings() == before


@pytest.mark.parametrize("shape", [(3, 128, 128), (2, 7000)])
def test_softmax_with_fast_exp_stays_within_float32_rounding(shape):
    x = te.placeholder(shape, "float32", name="x")
    mod = tvm.IRModule({"main": te.create_prim_func([x, topi.nn.softmax(x)])})
    a = (np.random.default_rng(0).standard_normal(shape) * 8).astype("float32")
    want = np.exp(a.astype("float64") - a.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    with vectorizable_exp():
        lib = tvm.tirx.build(mod, target=TARGET)
    got = _run(lib, a, np.zeros_like(a))
    assert np.abs(got - want).max() / want.max() < 2e-6
