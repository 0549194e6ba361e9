"""Forms real exporters write that TVM's importer rejected, fixed in the frontend.

Each case is a hand-built ONNX model of the pattern a corpus model showed
(``python -m benchmarks.coverage``); it must import and match ONNX Runtime on the
original model, and the stock importer's failure is pinned so the case stays relevant.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_fusion.errors import UnsupportedOpError
from tvm_fusion.frontend import import_model
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime

TOL = 1e-5


def _c(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(nodes, x_dims, inits, opset):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * len(x_dims))],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 6
    onnx.checker.check_model(model)
    return model


def resize_empty_scales():
    """PyTorch's opset-11 upsampling to a computed size (U-Net decoders, background
    removal): ``Resize(x, roi=[], scales=[], sizes=concat(N, C, 2H, 2W))``."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
        helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
        helper.make_node("Mul", ["hw", "two"], ["hw2"]),
        helper.make_node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "roi", "scales", "sizes"], ["y"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
    ]
    inits = [_c("zero", [0]), _c("two", [2]), _c("four", [4]),
             _c("roi", np.zeros(0), np.float32), _c("scales", np.zeros(0), np.float32)]
    return _model(nodes, [1, 3, "H", "W"], inits, 11)


def reshape_from_opset11_unsqueeze():
    """Paddle2ONNX's opset-11 reshape target: a scalar Gather of Shape, Unsqueeze with
    ``axes`` as an attribute (its opset-11 form), Concat. Folding must evaluate the
    Unsqueeze with opset-11 semantics for the target to become a constant."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["c"], axis=0),
        helper.make_node("Unsqueeze", ["c"], ["c1"], axes=[0]),
        helper.make_node("Concat", ["lead", "c1", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    inits = [_c("one", 1), _c("lead", [1]), _c("m1", [-1])]
    return _model(nodes, [1, "C", 4, 5], inits, 11)


def opset9_slice():
    """PyTorch 1.9's opset-9 export slicing a GRU's initial state: Slice with its bounds
    as attributes (inputs only from opset 10, the only form TVM's importer has)."""
    nodes = [helper.make_node("Slice", ["x"], ["s"], axes=[0], starts=[2], ends=[4]),
             helper.make_node("Relu", ["s"], ["y"])]
    return _model(nodes, [4, 1, "C"], [], 9)


def keras_rnn_loop(data_dependent_stop: bool = False):
    """tf2onnx's form of a Keras RNN layer: a Loop over the time steps whose trip count
    and condition come from the input's Shape, weights read from the outer scope, a
    constant of the body's own, the hidden states as a scan output."""
    rng = np.random.default_rng(2)
    stop = [helper.make_node("ReduceSum", ["h_new"], ["tot"], keepdims=0),
            helper.make_node("Less", ["tot", "big"], ["cond_out"])] if data_dependent_stop \
        else [helper.make_node("Less", ["i1", "steps"], ["cond_out"])]
    body = helper.make_graph(
        [helper.make_node("Gather", ["xt", "i"], ["xi"], axis=0),
         helper.make_node("MatMul", ["xi", "w"], ["a"]),
         helper.make_node("MatMul", ["h", "u"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["c"]),
         helper.make_node("Tanh", ["c"], ["h_new"]),
         helper.make_node("Add", ["i", "one"], ["i1"]), *stop,
         helper.make_node("Identity", ["h_new"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_new", TensorProto.FLOAT, [1, 3]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 3])],
        initializer=[_c("one", 1), _c("big", 1e9, np.float32)])
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("Shape", ["xt"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["steps"], axis=0),
        helper.make_node("Loop", ["steps", "go", "h0"], ["h_last", "hs"], body=body),
        helper.make_node("Add", ["hs", "h_last"], ["y"]),
    ]
    inits = [_c("zero", 0), _c("go", True, np.bool_), _c("h0", np.zeros((1, 3)), np.float32),
             _c("w", rng.standard_normal((4, 3)), np.float32),
             _c("u", rng.standard_normal((3, 3)), np.float32)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1, 3])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def _stock_import(model, shapes):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return from_onnx(model, shape_dict={k: list(v) for k, v in shapes.items()})


# (builder, shapes, the stock importer's failure given the same shapes or None, the ops
# left after folding, or a check of them)
CASES = {
    "resize-empty-scales": (resize_empty_scales, {"x": (1, 3, 5, 7)},
                            (AssertionError, "Only one of scales and sizes"), ["Resize"]),
    "opset11-unsqueeze-fold": (reshape_from_opset11_unsqueeze, {"x": (1, 6, 4, 5)},
                               None, ["Reshape", "Relu"]),
    "opset9-slice": (opset9_slice, {"x": (4, 1, 6)},
                     (ValueError, "Cannot cast <class 'NoneType'> to list of Expr"),
                     ["Slice", "Relu"]),
    "keras-rnn-loop": (keras_rnn_loop, {"x": (1, 5, 4)}, (Exception, "Loop"),
                       lambda ops: "Loop" not in ops and ops.count("Tanh") == 5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_form_imports_and_matches_onnxruntime(case):
    build, shapes, stock_err, ops_left = CASES[case]
    model = build()
    if stock_err is not None:
        with pytest.raises(stock_err[0], match=stock_err[1]):
            _stock_import(model, shapes)

    imported = import_model(model, shapes, name=case)
    ops = [n.op_type for n in imported.onnx_model.graph.node]
    assert ops_left(ops) if callable(ops_left) else ops == ops_left, ops
    arrays = random_inputs(imported.inputs, seed=5)
    ex = tvm.compile(imported.mod, target=tvm.target.Target({"kind": "llvm"}))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(arrays[0])).numpy()
    (want,) = run_onnxruntime(model, arrays)
    assert got.shape == want.shape == imported.outputs[0].shape
    assert max_rel_error(got, want) <= TOL
    # The folded model the import keeps is still one ONNX Runtime runs (the rewrite for
    # the importer is undone afterwards).
    (again,) = run_onnxruntime(imported.onnx_model, arrays)
    assert max_rel_error(again, want) <= TOL


def test_loop_that_may_stop_on_the_data_stays_a_loop_and_is_named():
    with pytest.raises(UnsupportedOpError, match=r"Loop: 1 node"):
        import_model(keras_rnn_loop(data_dependent_stop=True), {"x": (1, 5, 4)})


def test_dynamically_quantized_model_names_ops_nodes_and_the_qdq_fix():
    """onnxruntime's quantize_dynamic output (ddddocr's old recognizer): ConvInteger now
    converts (frontend/quant.py); the contrib DynamicQuantizeLSTM is named with its
    domain and the way out."""
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="q"),
        helper.make_node("ConvInteger", ["xq", "w", "xz"], ["ci"], name="Conv_0_quant"),
        helper.make_node("DynamicQuantizeLSTM", ["ci"], ["y"], name="LSTM_quant",
                         domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[_c("w", np.ones((2, 1, 3, 3)), np.int8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOpError) as info:
        import_model(model)
    text = str(info.value)
    assert "ConvInteger" not in text.splitlines()[1]
    assert "uses 1 operator type(s)" in text
    assert "com.microsoft.DynamicQuantizeLSTM: 1 node(s), e.g. 'LSTM_quant'" in text
    assert "quantize_static with QuantFormat.QDQ" in text
