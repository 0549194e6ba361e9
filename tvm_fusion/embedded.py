"""The embedded default model: a small residual CNN with an MLP head.

Built in code with a fixed seed, so the demo and the tests need no download. It holds
the patterns a fusion planner must get right: Conv-BN-ReLU, a residual Add, a global
pooling reduction, Gemm-bias-activation, and a Softmax.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NAME = "embedded-resnet-tiny"
INPUT_SHAPE = (1, 3, 32, 32)


def _conv_bn(nodes, inits, rng, name, x, cin, cout):
    """Append Conv(3x3, pad 1) + BatchNormalization; return the BN output name."""
    w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype("float32")
    inits += [
        numpy_helper.from_array(w, f"{name}.w"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype("float32"), f"{name}.gamma"),
        numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype("float32"), f"{name}.beta"),
        numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype("float32"), f"{name}.mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype("float32"), f"{name}.var"),
    ]
    nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [f"{name}.conv"], name=f"{name}/conv",
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node(
        "BatchNormalization",
        [f"{name}.conv", f"{name}.gamma", f"{name}.beta", f"{name}.mean", f"{name}.var"],
        [f"{name}.bn"], name=f"{name}/bn", epsilon=1e-5))
    return f"{name}.bn"


def _gemm(nodes, inits, rng, name, x, cin, cout):
    w = (rng.standard_normal((cout, cin)) * np.sqrt(1.0 / cin)).astype("float32")
    b = (rng.standard_normal(cout) * 0.1).astype("float32")
    inits += [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]
    nodes.append(helper.make_node("Gemm", [x, f"{name}.w", f"{name}.b"], [f"{name}.out"],
                                  name=f"{name}/gemm", transB=1))
    return f"{name}.out"


def build_embedded_model(seed: int = 0) -> onnx.ModelProto:
    """Build the embedded default model.

    Parameters
    ----------
    seed : int
        Seed of the weights; the default gives the model the demo and tests use.

    Returns
    -------
    onnx.ModelProto
        A checked ONNX model (opset 17) with input ``image`` of shape (1, 3, 32, 32)
        and output ``probs`` of shape (1, 10).
    """
    rng = np.random.default_rng(seed)
    nodes: list = []
    inits: list = []
    h = _conv_bn(nodes, inits, rng, "stem", "image", 3, 16)
    nodes.append(helper.make_node("Relu", [h], ["stem.relu"], name="stem/relu"))
    h = _conv_bn(nodes, inits, rng, "block", "stem.relu", 16, 16)
    nodes.append(helper.make_node("Add", [h, "stem.relu"], ["block.add"], name="block/add"))
    nodes.append(helper.make_node("Relu", ["block.add"], ["block.relu"], name="block/relu"))
    nodes.append(helper.make_node("GlobalAveragePool", ["block.relu"], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"))
    h = _gemm(nodes, inits, rng, "fc1", "flat", 16, 64)
    nodes.append(helper.make_node("Sigmoid", [h], ["fc1.sig"], name="fc1/sigmoid"))
    nodes.append(helper.make_node("Mul", [h, "fc1.sig"], ["fc1.silu"], name="fc1/silu"))
    h = _gemm(nodes, inits, rng, "fc2", "fc1.silu", 64, 10)
    nodes.append(helper.make_node("Softmax", [h], ["probs"], name="softmax", axis=-1))
    graph = helper.make_graph(
        nodes, NAME,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="tvm-fusion")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
