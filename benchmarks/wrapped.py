"""A zoo CNN as a layout-converting exporter leaves it: transposes and casts round each Conv.

``wrap_convs`` inserts, around every Conv, what tf2onnx-style and PyTorch NHWC exports
carry: NCHW -> NHWC -> NCHW Transpose pairs and identity (float -> float) Casts on the
input and on the output. The model computes exactly what it did; a compiler that does
not simplify runs the extra transposes and casts as kernels or epilogue ops.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def wrap_convs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with Transpose pairs and identity Casts around every 2-D Conv.

    Parameters
    ----------
    model : onnx.ModelProto
        A float32 model whose Convs are 2-D (NCHW).

    Returns
    -------
    onnx.ModelProto
        The wrapped model (checked by ``onnx.checker``), one Conv's worth of
        Transpose/Cast/Transpose on each side: 4 transposes and 2 casts per Conv.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for i, node in enumerate(out.graph.node):
        if node.op_type != "Conv":
            nodes.append(node)
            continue
        x, y = node.input[0], node.output[0]
        pre = _round_trip(x, f"wrap{i}_in")
        node.input[0] = pre[-1].output[0]
        post_in = f"wrap{i}_conv_out"
        node.output[0] = post_in
        post = _round_trip(post_in, f"wrap{i}_out", final=y)
        nodes += [*pre, node, *post]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    onnx.checker.check_model(out)
    return out


def _round_trip(src: str, tag: str, final: str | None = None) -> list[onnx.NodeProto]:
    a, b, c = f"{tag}_nhwc", f"{tag}_cast", final or f"{tag}_nchw"
    return [helper.make_node("Transpose", [src], [a], perm=TO_NHWC, name=a),
            helper.make_node("Cast", [a], [b], to=TensorProto.FLOAT, name=b),
            helper.make_node("Transpose", [b], [c], perm=TO_NCHW, name=c)]
