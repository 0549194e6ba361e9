"""Fold shape-only and constant subgraphs of an ONNX model whose input shapes are fixed.

Exported models compute reshape targets, pads and grids at run time from ``Shape`` of
intermediate tensors. TVM's Relax importer cannot turn those tensors back into static
shapes. Once every input shape is fixed, ONNX shape inference makes those ``Shape`` nodes
static, and evaluating every node whose inputs are all constants turns the subgraphs into
plain initializers that the importer reads as constants.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator

# A folded value may not grow the model by more than this many elements beyond what its
# inputs already hold: folding ConstantOfShape/Expand/Tile into huge tensors only bloats
# the model, and the importer handles those ops with constant operands anyway.
MAX_FOLD_ELEMENTS = 1 << 18
MAX_ROUNDS = 32
# Initializers up to this size keep their values during shape inference (shape constants).
_SHAPE_CONSTANT_LIMIT = 4096

# Ops never evaluated at import time: random ops differ per run, and folding
# (de)quantization would silently turn a quantized model into a float one.
_NEVER_FOLD = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
    "Multinomial", "Bernoulli", "QuantizeLinear", "DequantizeLinear",
    "DynamicQuantizeLinear",
})
_DEFAULT_DOMAINS = ("", "ai.onnx")
# Integer tensors of more elements than this are weights, not shape constants: a Cast of
# one to float is kept (int8 weight -> Cast -> Mul(scale) stays an int8 constant and a
# dequantize the planner fuses into its GEMM) instead of folding into 4x the bytes.
INT_WEIGHT_ELEMENTS = 1024
_WEIGHT_INTS = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4,
                onnx.TensorProto.UINT4, onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def fix_input_shapes(model: onnx.ModelProto,
                     shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """Return a copy of ``model`` whose graph inputs carry the given static shapes.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.
    shapes : dict of str to tuple of int
        A static shape for each graph input to fix.

    Returns
    -------
    onnx.ModelProto
        The copy, with stale intermediate shape annotations and output shapes cleared so
        that shape inference recomputes them from the fixed inputs.
    """
    fixed = _copy(model)
    for inp in fixed.graph.input:
        if inp.name not in shapes:
            continue
        tensor_type = inp.type.tensor_type
        tensor_type.ClearField("shape")
        tensor_type.shape.SetInParent()  # a scalar needs an empty shape, not a missing one
        for dim in shapes[inp.name]:
            tensor_type.shape.dim.add().dim_value = int(dim)
    _clear_inferred(fixed)
    return fixed


def fold_constants(model: onnx.ModelProto, *, max_rounds: int = MAX_ROUNDS) -> onnx.ModelProto:
    """Evaluate constant subgraphs and drop dead nodes until nothing changes.

    A node folds when all its inputs are initializers or folded values (``Constant``
    included), or when it is ``Shape``/``Size`` of a tensor whose shape inference found
    fully static. A top-level ``If`` whose condition folded is replaced by the branch it
    takes (an input fixed with ``consts``, see :mod:`.consts`). Shape inference reruns after every round, since new constants make
    further shapes static.

    Parameters
    ----------
    model : onnx.ModelProto
        A model with fixed input shapes (see :func:`fix_input_shapes`); not modified.
    max_rounds : int
        Upper bound on fold / infer rounds.

    Returns
    -------
    onnx.ModelProto
        The folded, shape-inferred model.
    """
    model = _copy(model)
    _infer(model)
    for _ in range(max_rounds):
        if not _fold_round(model):
            break
        _infer(model)
    return model


def _fold_round(model: onnx.ModelProto) -> bool:
    """Fold every foldable top-level node once, in place; False when nothing folded."""
    graph = model.graph
    opset = default_opset(model)
    graph_outputs = {o.name for o in graph.output}
    known = {t.name: t for t in graph.initializer}
    inlined = _fold_constant_ifs(
        graph, lambda name: numpy_helper.to_array(known[name]) if name in known else None)
    if inlined is not None:
        copies = onnx.GraphProto()
        copies.node.extend(inlined)  # copies: the originals go with the deletion below
        del graph.node[:]
        graph.node.extend(copies.node)
        _prune(model)
        return True
    static = _static_shapes(graph)
    values: dict[str, np.ndarray] = {}
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        result = _try_fold(node, known, values, static, opset, graph_outputs)
        if result is None:
            kept.append(node)
        else:
            values.update(result)
    if not values:
        return False

    nodes = [*_outputs_as_constants(graph.output, values), *kept]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(
        numpy_helper.from_array(arr, name) for name, arr in values.items()
        if name not in graph_outputs
    )
    _prune(model)
    return True


def _fold_constant_ifs(graph: onnx.GraphProto, constant) -> list[onnx.NodeProto] | None:
    """The top-level nodes with every ``If`` whose condition is known replaced by the
    branch it takes (its outputs renamed by Identity nodes); None when there is none.

    ``constant(name)`` returns the value of a constant tensor, or None.
    """
    nodes, changed = [], False
    for node in graph.node:
        cond = constant(node.input[0]) if node.op_type == "If" and node.domain in ("", "ai.onnx") \
            else None
        if cond is None:
            nodes.append(node)
            continue
        attrs = {a.name: a.g for a in node.attribute}
        branch = attrs["then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"]
        graph.initializer.extend(branch.initializer)
        nodes.extend(branch.node)
        nodes.extend(onnx.helper.make_node("Identity", [b.name], [o], name=f"{node.name or o}_taken")
                     for b, o in zip(branch.output, node.output))
        changed = True
    return nodes if changed else None


def _try_fold(node, known, values, static, opset,
              graph_outputs) -> dict[str, np.ndarray] | None:
    """The values of ``node``'s outputs if it can be folded, else None."""
    if node.domain not in _DEFAULT_DOMAINS or node.op_type in _NEVER_FOLD:
        return None
    graph_attrs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    if any(a.type in graph_attrs for a in node.attribute):
        return None  # control flow: its branches are left to the importer
    if node.op_type == "Constant" and node.output[0] in graph_outputs:
        return None  # already the simplest form of a constant graph output
    if node.op_type in ("Shape", "Size") and node.input[0] in static:
        return {node.output[0]: _shape_value(node, static[node.input[0]])}
    names = [i for i in node.input if i]
    if not all(i in known or i in values for i in names):
        return None
    if node.op_type in ("Cast", "CastLike") and _is_int_weight(names[0], known, values):
        return None
    # A Constant is already in the model, whatever its size; other ops may not grow it much.
    in_size = sum(values[i].size if i in values else math.prod(known[i].dims) for i in names)
    budget = math.inf if node.op_type == "Constant" else max(MAX_FOLD_ELEMENTS, in_size)
    out_shapes = [static.get(o) for o in node.output if o]
    if None not in out_shapes and sum(math.prod(s) for s in out_shapes) > budget:
        return None  # known too big before spending the time and memory to compute it
    feeds = {i: values[i] if i in values else numpy_helper.to_array(known[i]) for i in names}
    try:
        results = _evaluate(node, feeds, opset)
    except Exception:  # noqa: BLE001 - an op the evaluator lacks just stays in the graph
        return None
    results = [np.asarray(r) for r in results]
    if any(r.dtype == object for r in results) or sum(r.size for r in results) > budget:
        return None
    # Results come for the named outputs only, in order (an omitted optional one is "").
    return dict(zip([o for o in node.output if o], results))


def _is_int_weight(name: str, known, values) -> bool:
    """Whether ``name`` is a narrow-integer tensor big enough to be a weight."""
    if name in values:
        arr = values[name]
        return arr.dtype.kind in "iu" and arr.itemsize <= 2 and arr.size > INT_WEIGHT_ELEMENTS
    init = known[name]
    return init.data_type in _WEIGHT_INTS and math.prod(init.dims) > INT_WEIGHT_ELEMENTS


def _evaluate(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int) -> list:
    """Run one node with the semantics of the model's opset.

    ``ReferenceEvaluator(node, opsets=...)`` ignores ``opsets`` for a bare node and runs
    the newest version of the op, so an opset-11 ``Unsqueeze`` (axes as an attribute)
    fails and other ops could silently change meaning: wrap the node in a one-node model
    that imports the right opset.
    """
    inputs = [onnx.helper.make_tensor_value_info(
        name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
        for name, arr in feeds.items()]
    outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = onnx.helper.make_graph([node], "fold", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(math.prod(shape), dtype=np.int64)
    # Python slicing clamps negative and out-of-range bounds just as ONNX Shape does.
    attrs = {a.name: a.i for a in node.attribute}
    return np.array(shape[attrs.get("start", 0):attrs.get("end")], dtype=np.int64)


def _outputs_as_constants(outputs, values) -> Iterator[onnx.NodeProto]:
    # A graph output must be produced by a node for the importer and ONNX Runtime alike.
    for out in outputs:
        if out.name in values:
            tensor = numpy_helper.from_array(values[out.name], out.name + "_value")
            yield onnx.helper.make_node("Constant", [], [out.name], value=tensor,
                                        name=out.name + "_folded")


def _prune(model: onnx.ModelProto) -> None:
    """Drop nodes, initializers and initializer inputs that no graph output needs."""
    graph = model.graph
    live = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(o in live for o in node.output):
            kept.append(node)
            live.update(_node_reads(node))
    del graph.node[:]
    graph.node.extend(reversed(kept))
    init_names = {t.name for t in graph.initializer}
    # Delete in place: rebuilding the repeated field would copy every weight.
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name not in live:
            del graph.initializer[index]
    inits = list(graph.initializer)
    kept_names = {t.name for t in inits}
    inputs = [i for i in graph.input if i.name not in init_names or i.name in kept_names]
    if model.ir_version < 4:  # before IR 4 every initializer must also be a graph input
        listed = {i.name for i in inputs}
        inputs += [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in inits if t.name not in listed]
    del graph.input[:]
    graph.input.extend(inputs)


def _node_reads(node: onnx.NodeProto) -> Iterable[str]:
    """Every name a node reads, including outer-scope names its subgraphs use."""
    yield from (i for i in node.input if i)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
            for inner in sub.node:
                yield from _node_reads(inner)


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        shape = static_shape(info)
        if shape is not None:
            shapes[info.name] = shape
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def static_shape(info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """The shape of a tensor value info if every dim is a known value, else None."""
    tensor_type = info.type.tensor_type
    if not info.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
        return None
    dims = tensor_type.shape.dim
    if any(not d.HasField("dim_value") or d.dim_value < 0 for d in dims):
        return None
    return tuple(int(d.dim_value) for d in dims)


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default ONNX operator set ``model`` imports.

    Every stage of the frontend reads it from here, so that what folding evaluates, what
    the RNN and Loop unrollers emit, the Slice rewrite and TVM's converter agree.

    Parameters
    ----------
    model : onnx.ModelProto

    Returns
    -------
    int
        The first import of the ``""`` / ``"ai.onnx"`` domain. A model that imports only
        other domains (``onnx.checker`` rejects it) gets the newest opset this onnx knows,
        as ONNX Runtime, the reference, runs it; TVM's own ``from_onnx`` would take 1,
        under which an opset-13 Unsqueeze fails to convert.
    """
    for op in model.opset_import:
        if op.domain in _DEFAULT_DOMAINS:
            return op.version
    return onnx.defs.onnx_opset_version()


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _clear_inferred(model: onnx.ModelProto) -> None:
    # Stale symbolic annotations can conflict with the fixed shapes; inference redoes them.
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")


def _infer(model: onnx.ModelProto) -> None:
    """Shape inference with data propagation, in place; degrades gracefully on odd models.

    It runs on a light copy whose large weights are plain inputs of the same type and
    shape: values matter only for small shape constants, and serializing every weight
    each round would dominate the import time of transformer models.
    """
    _clear_inferred(model)
    light = _light_copy(model)
    for data_prop in (True, False):
        try:
            inferred = shape_inference.infer_shapes(light, check_type=False, strict_mode=False,
                                                    data_prop=data_prop)
            break
        except Exception:  # noqa: BLE001 - inference is a help, never a requirement
            continue
    else:
        return
    model.graph.value_info.extend(inferred.graph.value_info)
    for out, new in zip(model.graph.output, inferred.graph.output):
        out.type.CopyFrom(new.type)


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    light = onnx.ModelProto(ir_version=max(model.ir_version, 4), producer_name="tvm-fusion")
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = graph.name
    g.node.extend(graph.node)
    g.output.extend(graph.output)
    g.input.extend(graph.input)
    listed = {i.name for i in graph.input}
    for init in graph.initializer:
        if math.prod(init.dims) <= _SHAPE_CONSTANT_LIMIT:
            g.initializer.append(init)
        elif init.name not in listed:
            g.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    return light
