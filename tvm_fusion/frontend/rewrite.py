"""Rewrites of a folded ONNX graph into forms TVM's Relax importer accepts.

Each rewrite keeps the model's meaning and fixes a way real exporters write a model that
the stock importer rejects. The rewritten form is what the importer reads, not always a
valid ONNX model of the file's opset (an absent ``scales`` is opset 13's form), so it
lasts only while the importer runs: ``ImportedModel.onnx_model`` stays runnable by ONNX
Runtime.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import onnx
import onnx.numpy_helper

from .fold import default_opset

# Optional inputs that exporters fill with an empty tensor instead of leaving them out:
# ONNX treats an empty one as absent. PyTorch's opset-11 Resize writes an empty ``scales``
# beside a computed ``sizes`` (and an empty ``roi``), which TVM's importer rejects with
# "Only one of scales and sizes can be provided in Resize".
_EMPTY_MEANS_ABSENT = {"Resize": (1, 2, 3)}


@contextlib.contextmanager
def rewritten_for_import(model: onnx.ModelProto) -> Iterator[onnx.ModelProto]:
    """``model`` in the importer's form for the ``with`` block, then as it was.

    The rewrites only rename node inputs and add small initializers, so they are undone
    without copying weights.
    """
    n_inits = len(model.graph.initializer)
    saved = drop_empty_optional_inputs(model) + slice_attributes_as_inputs(model)
    try:
        yield model
    finally:
        for node, inputs in reversed(saved):
            del node.input[:]
            node.input.extend(inputs)
        del model.graph.initializer[n_inits:]


def slice_attributes_as_inputs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, list]]:
    """Give opset-1..9 Slices (``starts``/``ends``/``axes`` attributes) those as inputs.

    TVM's importer has only the opset-10+ Slice, whose bounds are inputs: it fails on the
    attribute form ("Cannot cast NoneType to list of Expr"; PyTorch 1.9 opset-9 exports
    slice a GRU's initial state this way). The attributes stay; the importer ignores
    them. Returns each changed node with its inputs before the change.
    """
    if default_opset(model) >= 10:
        return []
    changed = []
    for node in model.graph.node:
        attrs = {a.name: list(a.ints) for a in node.attribute}
        if node.op_type != "Slice" or len(node.input) != 1 or "starts" not in attrs:
            continue
        changed.append((node, list(node.input)))
        for key in ("starts", "ends", "axes"):
            if key in attrs:
                name = f"{node.output[0]}__slice_{key}"
                model.graph.initializer.append(onnx.numpy_helper.from_array(
                    np.array(attrs[key], np.int64), name))
                node.input.append(name)
    return changed


def drop_empty_optional_inputs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, list]]:
    """Replace empty constant tensors given as optional inputs by absent ones (``""``).

    Returns
    -------
    list of (onnx.NodeProto, list of str)
        Each changed node and its inputs before the change.
    """
    graph = model.graph
    empty = {t.name for t in graph.initializer if math.prod(t.dims) == 0 and len(t.dims)}
    empty |= {n.output[0] for n in graph.node if n.op_type == "Constant" and _empty_constant(n)}
    changed = []
    for node in graph.node:
        slots = [i for i in _EMPTY_MEANS_ABSENT.get(node.op_type, ())
                 if i < len(node.input) and node.input[i] in empty]
        if not slots:
            continue
        changed.append((node, list(node.input)))
        for i in slots:
            node.input[i] = ""
        while node.input and not node.input[-1]:  # trailing absent inputs are left out
            node.input.pop()
    return changed


def _empty_constant(node: onnx.NodeProto) -> bool:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return len(attr.t.dims) > 0 and math.prod(attr.t.dims) == 0
    return False
