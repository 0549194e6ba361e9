"""Default GPU schedules within the target's thread-block limits.

dlight binds threads by the output's shape, so the 1 x 64 by 64 x 3 matmul of a
classifier head (DNSMOS's last dense layer) got a 3 x 16 block, a partial warp that
``compile_model``'s check refused: the untuned model did not build for a100 at all.
A later rule in dlight's order must take such a kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.gpu import find_nvcc
from tvm_fusion.schedules.default import default_gpu_schedule
from tvm_fusion.schedules.tir_check import check_scheduled


def _head(batch: int = 1, width: int = 64, classes: int = 3):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])],
        initializer=[numpy_helper.from_array(rng.standard_normal((width, classes))
                                             .astype(np.float32), "w"),
                     numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32),
                                             "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return tf.import_model(model, name="head")


def test_a_rule_whose_block_is_a_partial_warp_is_passed_over():
    model, hw = _head(), tf.load_target("a100")
    graph = tf.build_graph(model.mod)
    mod = tf.apply_plan(graph, tf.plan_fusion(graph, hw))
    stock = check_scheduled(default_gpu_schedule(mod, hw.tvm_target()), hw)
    assert any("not a multiple of the 32-wide warp" in v for vs in stock.values() for v in vs)
    ours = check_scheduled(default_gpu_schedule(mod, hw.tvm_target(), hw), hw)
    assert ours and not any(ours.values()), ours


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) not installed")
def test_untuned_head_compiles_for_a100():
    compiled = tf.compile_model(_head(), "a100", logs=None)
    assert compiled.kernels and set(compiled.untuned) == set(compiled.kernels)
