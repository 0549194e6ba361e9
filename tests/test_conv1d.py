"""1-D and tiny pointwise convolutions run in NHWC, as GEMMs on the register tile
(tvm_fusion.simplify.line_convs): a W = 1 conv with a k x 1 kernel, an H = 1 one, an ONNX
1-D Conv and a 1 x 1 conv on a 3 x 3 map are moved, the transposes of tf2onnx's Conv1D
pattern cancel, the conv's kernel gets register-tile spaces, and every model still
matches ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto as T
from onnx import helper as h
from tvm import relax
from tvm.s_tir import meta_schedule as ms

import onnx_cases as oc
from tvm_fusion import compile_model, import_model
from tvm_fusion.graph import build_graph
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
from tvm_fusion.targets import load_target
from tvm_fusion.tune.space import load_search_space, space_generator


def _conv(x_shape, w_shape, y_shape, *, relu=False, seed=0, **attrs):
    """x -> Conv(w, b) [-> Relu] -> y, NCHW (or NCW) as ONNX writes it."""
    rng = np.random.default_rng(seed)
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(h.make_node("Relu", ["c"], ["y"]))
    return oc.make("conv", nodes, [h.make_tensor_value_info("x", T.FLOAT, x_shape)],
                   [h.make_tensor_value_info("y", T.FLOAT, y_shape)],
                   [oc.const("w", rng.standard_normal(w_shape)),
                    oc.const("b", rng.standard_normal(w_shape[0]))])


def _tf2onnx_conv1d(length=40, cin=16, cout=32, taps=5, seed=0):
    """tf2onnx's Conv1D (Magika's): NWC data unsqueezed to (N, W, C, 1), transposed to
    NCHW with W = 1, a k x 1 conv, its unit W sliced (all of it) and squeezed, then a
    slice of the positions and a max over them."""
    rng = np.random.default_rng(seed)
    out = length - taps + 1
    return oc.make("tf_conv1d", [
        h.make_node("Unsqueeze", ["x", "ax3"], ["u"]),
        h.make_node("Transpose", ["u"], ["t"], perm=[0, 2, 1, 3]),
        h.make_node("Conv", ["t", "w"], ["c"]),
        h.make_node("Slice", ["c", "zero", "one", "ax3"], ["c1"]),
        h.make_node("Squeeze", ["c1", "ax3"], ["s0"]),
        h.make_node("Slice", ["s0", "one", "last", "ax2"], ["s"]),
        h.make_node("Add", ["s", "b"], ["a"]),
        h.make_node("Relu", ["a"], ["r"]),
        h.make_node("ReduceMax", ["r"], ["y"], axes=[2], keepdims=0),
    ], [h.make_tensor_value_info("x", T.FLOAT, [1, length, cin])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, cout])],
        [oc.const("ax3", [3], np.int64), oc.const("ax2", [2], np.int64),
         oc.const("zero", [0], np.int64), oc.const("one", [1], np.int64),
         oc.const("last", [out - 1], np.int64),
         oc.const("w", rng.standard_normal((cout, cin, taps, 1))),
         oc.const("b", rng.standard_normal((cout, 1)))])


MOVED = {
    "w1_kx1": lambda: _conv([1, 16, 40, 1], [32, 16, 5, 1], [1, 32, 36, 1], relu=True),
    "h1_1xk_padded": lambda: _conv([1, 16, 1, 40], [32, 16, 1, 3], [1, 32, 1, 40],
                                   pads=[0, 1, 0, 1]),
    "conv1d_dilated": lambda: _conv([1, 16, 41], [32, 16, 5], [1, 32, 33], dilations=[2]),
    "pointwise_3x3": lambda: _conv([1, 16, 3, 3], [32, 16, 1, 1], [1, 32, 3, 3], relu=True),
    "tf2onnx_conv1d": _tf2onnx_conv1d,
}

KEPT = {
    # its last axis fills vectors in NCHW already: the register tile takes it as it is
    "h1_aligned": lambda: _conv([1, 16, 1, 36], [32, 16, 1, 5], [1, 32, 1, 32]),
    # output channels no multiple of a vector
    "w1_24_filters": lambda: _conv([1, 16, 40, 1], [24, 16, 5, 1], [1, 24, 36, 1]),
    "grouped": lambda: _conv([1, 16, 40, 1], [32, 8, 5, 1], [1, 32, 36, 1], group=2),
    # a 2-D conv: W and its kernel both over 1
    "square": lambda: _conv([1, 16, 8, 8], [32, 16, 3, 3], [1, 32, 6, 6]),
}


@pytest.mark.parametrize("name", sorted(MOVED))
def test_line_convs_run_nhwc_and_match_onnxruntime(name):
    proto = MOVED[name]()
    model = import_model(proto)
    assert model.simplified.line_convs == 1
    convs = [f for gv, f in build_graph(model.mod).mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith("conv")]
    assert len(convs) == 1
    # the output channels are the conv's last axis: the register tile's vector lanes
    assert [int(d) for d in convs[0].params[-1].shape][-1] == 32
    x = random_inputs(model.inputs, seed=1)
    vm = relax.VirtualMachine(compile_model(model, "host").executable, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in x]).numpy()
    assert max_rel_error(got, run_onnxruntime(proto, x)[0]) <= 1e-5


def test_tf2onnx_conv1d_transposes_cancel():
    report = import_model(_tf2onnx_conv1d()).simplified
    assert (report.transposes_before, report.transposes_after) == (1, 0)


@pytest.mark.parametrize("name", sorted(KEPT))
def test_other_convs_keep_nchw(name):
    assert import_model(KEPT[name]()).simplified.line_convs == 0


def _register_tile_spaces(func):
    host = load_target("host").tvm_target()
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")
                        .with_attr("layout_free_buffers", [1])})
    ctx = ms.TuneContext(mod=mod, target=host, search_strategy="evolutionary", rand_state=1,
                         space_generator=space_generator(load_search_space("cpu"), host))
    spaces = [s for s in ctx.generate_design_space()
              if any(i.kind.name == "Annotate" and "tvm_fusion.register_tile" in str(i.inputs[1])
                     for i in s.trace.insts)]
    return host, ctx, spaces


def test_w1_conv_kernel_is_register_tiled_and_correct():
    """The W = 1 conv's kernel is a GEMM to the rules: register-tile spaces, each
    correct against numpy with its weight packed as the schedule wants (prepacking)."""
    graph = build_graph(import_model(MOVED["w1_kx1"]()).mod)
    func = next(f for gv, f in graph.mod.functions.items()
                if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith("conv"))
    host, ctx, spaces = _register_tile_spaces(func)
    assert spaces, "no register-tile space for the W = 1 conv"
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (1, 40, 1, 16)).astype(np.float32)
    w = rng.uniform(-1, 1, (5, 1, 16, 32)).astype(np.float32)  # HWIO
    want = sum(np.einsum("lc,co->lo", x[0, k:k + 36, 0], w[k, 0]) for k in range(5))
    for sch in spaces:
        sch = sch.copy()
        assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
        out = tvm.runtime.tensor(np.zeros((1, 36, 1, 32), np.float32))
        # tvm.tirx.build keeps the weight's packing block (the tuner's builder drops it)
        tvm.tirx.build(sch.mod, target=host)(tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
        np.testing.assert_allclose(out.numpy()[0, :, 0], want, rtol=1e-5, atol=1e-5)
