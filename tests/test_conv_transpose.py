"""Transposed convolutions whose stride equals their kernel (PP-OCR det's upsampling head)
legalize as one reduction over the input channels, with no zero-dilated or padded
intermediates (tvm_fusion/graph/conv_transpose.py); the rest keep TVM's legalization.
Both match ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm

import tvm_fusion as tf
from tvm_fusion.plan import plan_model
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
from tvm_fusion.kernels.schedulable import kernel_module

from onnx_cases import _vi, T, const, h, make


def _model(k: int, s: int, cout: int, pads=(0, 0, 0, 0)) -> onnx.ModelProto:
    rng = np.random.default_rng(k * 10 + cout)
    size = (8 - 1) * s + k - pads[0] - pads[2]
    return make("deconv", [
        h.make_node("ConvTranspose", ["x", "w", "b"], ["d"], strides=[s, s], pads=list(pads)),
        h.make_node("Sigmoid", ["d"], ["y"]),
    ], [_vi("x", T.FLOAT, [1, 6, 8, 8])], [_vi("y", T.FLOAT, [1, cout, size, size])],
        [const("w", rng.standard_normal((6, cout, k, k))), const("b", rng.standard_normal(cout))])


@pytest.mark.parametrize("k,s,cout,pads,direct", [
    (2, 2, 1, (0, 0, 0, 0), True),    # PP-OCR det's last layer
    (2, 2, 4, (0, 0, 0, 0), True),
    (3, 3, 2, (0, 0, 0, 0), True),
    (3, 2, 4, (0, 0, 0, 0), False),   # taps overlap: TVM's legalization
    (2, 2, 4, (1, 1, 1, 1), False),   # padding: TVM's legalization
])
def test_conv_transpose_matches_onnxruntime(tmp_path, k, s, cout, pads, direct):
    path = tmp_path / "deconv.onnx"
    onnx.save(_model(k, s, cout, pads), path)
    model = tf.import_model(path)
    graph, plan = plan_model(model.mod, "host")
    kernel = next(f for gv, f in kernel_module(graph, plan, prepack=False).functions.items()
                  if "conv2d_transpose" in gv.name_hint)
    sch = tvm.s_tir.Schedule(kernel)
    blocks = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert ("data_dilate" not in blocks and "data_pad" not in blocks) == direct, blocks
    module = tf.load_module(tf.compile_model(model, "host").export(tmp_path / "m.so"))
    inputs = random_inputs(model.inputs)
    want = run_onnxruntime(model.onnx_model, inputs)
    assert max(max_rel_error(g, w) for g, w in zip(module(*inputs), want)) < 1e-5
