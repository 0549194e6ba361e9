"""Architectures no PyPI wheel ships at a size we can fetch, written out with onnx.helper.

``resnet50``: ResNet-50 v1.5 (He et al. 2016; torchvision's layout: stride on the 3x3
conv of each bottleneck), batch norms as separate nodes as an exporter writes them, an
NHWC input transposed to NCHW first (a TensorFlow-style export), seeded random weights
(He initialisation, so activations stay in range through 50 layers). Latency depends
on the architecture, not on the weights' values; the file is built on demand into the
model cache, never committed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion import config


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, kind: str) -> str:
        self.n += 1
        return f"{kind}_{self.n}"

    def const(self, array: np.ndarray, kind: str) -> str:
        name = self.name(kind)
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        fan_in = cin * k * k
        w = self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / fan_in)
        y = self.name("conv")
        self.nodes.append(helper.make_node(
            "Conv", [x, self.const(w, "w")], [y], kernel_shape=[k, k],
            strides=[stride, stride], pads=[k // 2] * 4, name=y))
        bn = [self.const(v, kind) for v, kind in (
            (1.0 + 0.1 * self.rng.standard_normal(cout), "gamma"),
            (0.1 * self.rng.standard_normal(cout), "beta"),
            (0.1 * self.rng.standard_normal(cout), "mean"),
            (1.0 + 0.1 * self.rng.random(cout), "var"))]
        z = self.name("bn")
        self.nodes.append(helper.make_node("BatchNormalization", [y, *bn], [z], name=z))
        if not relu:
            return z
        r = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [z], [r], name=r))
        return r

    def op(self, kind: str, inputs, **attrs) -> str:
        y = self.name(kind.lower())
        self.nodes.append(helper.make_node(kind, list(inputs), [y], name=y, **attrs))
        return y


def resnet50_proto(*, size: int = 224, seed: int = 0, nhwc: bool = True) -> onnx.ModelProto:
    """ResNet-50 as an ONNX model (opset 13), input ``x`` of (1, size, size, 3) when
    ``nhwc`` else (1, 3, size, size), output ``logits`` (1, 1000)."""
    b = _Builder(seed)
    x = b.op("Transpose", ["x"], perm=[0, 3, 1, 2]) if nhwc else "x"
    x = b.conv_bn(x, 3, 64, 7, 2, relu=True)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            y = b.conv_bn(x, cin, width, 1, 1, relu=True)
            y = b.conv_bn(y, width, width, 3, s, relu=True)
            y = b.conv_bn(y, width, width * 4, 1, 1, relu=False)
            short = b.conv_bn(x, cin, width * 4, 1, s, relu=False) if i == 0 else x
            x = b.op("Relu", [b.op("Add", [y, short])])
            cin = width * 4
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    w = b.rng.standard_normal((cin, 1000)) * np.sqrt(1.0 / cin)
    x = b.op("Gemm", [x, b.const(w.T, "fc_w"), b.const(np.zeros(1000), "fc_b")], transB=1)
    b.nodes[-1].output[0] = "logits"
    shape = [1, size, size, 3] if nhwc else [1, 3, size, size]
    graph = helper.make_graph(
        b.nodes, "resnet50", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def resnet50_path(*, size: int = 224, seed: int = 0) -> Path:
    """The NHWC ResNet-50's ``.onnx`` in the model cache, built on first use."""
    path = Path(config.MODEL_CACHE.get()).expanduser() / f"resnet50-nhwc-{size}-s{seed}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        onnx.save(resnet50_proto(size=size, seed=seed), tmp)
        tmp.replace(path)
    return path


if __name__ == "__main__":
    print(resnet50_path())
