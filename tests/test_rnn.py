"""ONNX LSTM, GRU and RNN (issue 17): TVM 0.27's importer has none, the frontend unrolls
them (tvm_fusion/frontend/rnn.py); each case is planned, compiled for the host and
checked against ONNX Runtime (or, for the batch-major layout ONNX Runtime lacks, ONNX's
reference evaluator)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import onnx_cases as oc
from tvm_fusion import build_graph, compile_model, import_model, load_module, load_target
from tvm_fusion.errors import UnsupportedOpError
from tvm_fusion.plan import make_plan
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime


def _compile_and_compare(proto, tmp_path, name, *, reference="ort"):
    model = import_model(proto)
    assert not {n.op_type for n in model.onnx_model.graph.node} & {"LSTM", "GRU", "RNN"}
    module = load_module(compile_model(model, "host").export(tmp_path / f"{name}.so"))
    inputs = random_inputs(model.inputs, seed=2)
    got = module(*inputs)
    if reference == "ort":
        want = run_onnxruntime(proto, inputs)
    else:
        want = ReferenceEvaluator(proto).run(None, {i.name: x for i, x in zip(model.inputs, inputs)})
    assert len(got) == len(want) == len(proto.graph.output)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert max_rel_error(g, w) < 1e-5
    return model


@pytest.mark.parametrize("kw", [
    dict(op="LSTM"),
    dict(op="GRU"),
    dict(op="RNN"),
    dict(op="LSTM", direction="bidirectional", peepholes=True),
    dict(op="GRU", direction="reverse", linear_before_reset=1),
    dict(op="LSTM", opset=22, clip=0.7, initial=False),
    dict(op="LSTM", opset=7, input_forget=1),
    dict(op="RNN", opset=7, initial=False, direction="bidirectional",
         activations=["Relu", "Tanh"]),
], ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_recurrent_op_matches_onnxruntime(kw, tmp_path):
    _compile_and_compare(oc.recurrent(**kw), tmp_path, "rnn")


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_batch_major_layout_matches_the_onnx_reference(op, tmp_path):
    """layout=1 (opset 14+): ONNX Runtime refuses it, ONNX's reference evaluator runs it."""
    _compile_and_compare(oc.recurrent(op, layout=1, direction="bidirectional"), tmp_path,
                         "rnn_layout1", reference="onnx")


def test_unrolled_lstm_plans_for_every_target():
    graph = build_graph(import_model(oc.recurrent("LSTM", seq=4)).mod)
    for target in ("host", "x86_avx512", "a100", "mi250x"):
        plan = make_plan(graph, load_target(target), "cost")
        assert sorted(n for g in plan.groups for n in set(g.nodes)) == list(range(len(graph.nodes)))
        assert len(plan.groups) < len(graph.nodes)  # the gate math fuses


def test_weights_computed_at_run_time_name_the_node():
    proto = oc.recurrent("GRU")  # hidden 4, input 3: W is 1 x 12 x 3
    del proto.graph.initializer[0]  # W becomes a model input: known only at run time
    proto.graph.input.append(helper.make_tensor_value_info("W", 1, [1, 12, 3]))
    with pytest.raises(UnsupportedOpError, match="GRU node 'gru0'.*W is computed at run time"):
        import_model(proto)


def test_ragged_sequence_lens_are_refused_with_the_reason():
    proto = oc.recurrent("LSTM", seq=5, batch=2)
    proto.graph.initializer.append(oc.const("lens", [5, 3], np.int32))
    proto.graph.node[0].input[4] = "lens"
    with pytest.raises(UnsupportedOpError, match="LSTM node 'lstm0'.*sequence_lens"):
        import_model(proto)
