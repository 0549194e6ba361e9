"""Unroll ONNX ``Loop`` nodes whose trip count is fixed once the input shapes are.

TVM's Relax importer has no ``Loop``. tf2onnx writes every Keras RNN layer as one (a
``while_loop`` over the time steps, trip count from the input's shape, a condition that
only compares step counters), so a fixed input shape makes the loop a straight line of
steps. Each step is a copy of the body with its own names; the scan outputs are stacked
along a new first axis, as ``Loop`` does. The unrolled form is kept only if every step's
condition folds to true (the loop would have run all its steps): a loop that can stop
early on data stays a ``Loop`` and the importer's error names it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fold import default_opset

MAX_TRIPS = 256  # longer loops would bloat the graph; they stay loops
MAX_ROUNDS = 16  # loops whose trip count waits on an earlier loop, one per round


def unroll_loops(model: onnx.ModelProto, fold) -> onnx.ModelProto:
    """``model`` with every unrollable top-level ``Loop`` unrolled, folded by ``fold``.

    Parameters
    ----------
    model : onnx.ModelProto
        A folded model (trip counts already constants); not modified.
    fold : callable
        ``fold(model) -> model``, the constant folder (it evaluates the conditions).

    Returns
    -------
    onnx.ModelProto
        The same object when nothing was unrolled, else a new folded model.
    """
    # A loop's trip count may come from the shape of an earlier loop's output (stacked
    # RNN layers): it is a constant only once that loop is unrolled and folded.
    for round_ in range(MAX_ROUNDS):
        unrolled = _unroll_once(model, fold, round_)
        if unrolled is model:
            break
        model = unrolled
    return model


def _unroll_once(model: onnx.ModelProto, fold, round_: int) -> onnx.ModelProto:
    if not any(n.op_type == "Loop" for n in model.graph.node):
        return model
    candidate = onnx.ModelProto()
    candidate.CopyFrom(model)
    consts = {t.name: numpy_helper.to_array(t) for t in candidate.graph.initializer}
    opset = default_opset(candidate)
    nodes, conds, changed = [], [], False
    for index, node in enumerate(candidate.graph.node):
        tag = f"__unroll{round_}.{index}"  # new names: unique per round and loop
        steps = _unrolled(node, tag, consts, opset) if node.op_type == "Loop" else None
        if steps is None:
            nodes.append(node)
        else:
            nodes += steps[0]
            conds += steps[1]
            changed = True
    if not changed:
        return model
    graph = candidate.graph
    del graph.node[:]
    graph.node.extend(nodes)
    # Conditions become graph outputs for the fold, which then turns them into Constants.
    graph.output.extend(helper.make_empty_tensor_value_info(c) for c in conds)
    folded = fold(candidate)
    values = {n.output[0]: numpy_helper.to_array(n.attribute[0].t)
              for n in folded.graph.node if n.op_type == "Constant" and n.output[0] in conds}
    values.update((t.name, numpy_helper.to_array(t)) for t in folded.graph.initializer
                  if t.name in conds)
    if set(values) != set(conds) or not all(bool(np.all(v)) for v in values.values()):
        return model  # a loop that may stop early on the data: not unrollable
    keep = [o for o in folded.graph.output if o.name not in set(conds)]
    del folded.graph.output[:]
    folded.graph.output.extend(keep)
    kept = [n for n in folded.graph.node if not (n.op_type == "Constant" and n.output[0] in conds)]
    del folded.graph.node[:]
    folded.graph.node.extend(kept)
    return fold(folded)


def _unrolled(loop: onnx.NodeProto, tag: str, consts: dict, opset: int):
    """``(nodes, condition names)`` replacing ``loop``, or None if it cannot be unrolled.

    The conditions named are those the steps after the first start on: each must fold
    to true for the unrolled form to be the loop.
    """
    body = next((a.g for a in loop.attribute if a.name == "body"), None)
    trip_name = loop.input[0] if loop.input else ""
    if body is None or trip_name not in consts:
        return None
    trips = int(consts[trip_name])
    if not 0 < trips <= MAX_TRIPS or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for n in body.node for a in n.attribute):
        return None
    carried = list(loop.input[2:])
    n_carried, n_scan = len(carried), len(body.output) - 1 - len(carried)
    iter_dtype = helper.tensor_dtype_to_np_dtype(body.input[0].type.tensor_type.elem_type)
    # The body's own initializers become constants shared by every step.
    nodes: list[onnx.NodeProto] = [
        helper.make_node("Constant", [], [f"{t.name}{tag}"], name=f"{t.name}{tag}", value=t)
        for t in body.initializer]
    local = {t.name: f"{t.name}{tag}" for t in body.initializer}
    conds: list[str] = []
    cond = loop.input[1] if len(loop.input) > 1 else ""
    if cond and not (cond in consts and bool(np.all(consts[cond]))):
        return None  # a loop that may not run at all
    scans: list[list[str]] = [[] for _ in range(n_scan)]
    for step in range(trips):
        step_name = f"{body.input[0].name}{tag}_{step}"
        nodes.append(helper.make_node("Constant", [], [step_name], name=step_name,
                                      value=numpy_helper.from_array(np.array(step, iter_dtype))))
        names = {**local, body.input[0].name: step_name, **dict(zip(
            (i.name for i in body.input[2:]), carried))}
        if cond:
            names[body.input[1].name] = cond
        for j, node in enumerate(body.node):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name or node.op_type + str(j)}{tag}_{step}"
            for i, name in enumerate(copy.input):
                copy.input[i] = names.get(name, name)  # outer-scope names stay as they are
            for i, name in enumerate(copy.output):
                if name:
                    names[name] = copy.output[i] = f"{name}{tag}_{step}"
            nodes.append(copy)
        outs = [names.get(o.name, o.name) for o in body.output]
        cond = outs[0]
        if step + 1 < trips:  # the last step's condition decides nothing
            conds.append(cond)
        carried = outs[1:1 + n_carried]
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
    # The Loop's outputs: the final carried values, then each scan output stacked.
    for out, value in zip(loop.output[:n_carried], carried):
        if out:
            nodes.append(helper.make_node("Identity", [value], [out], name=f"{out}{tag}"))
    for k, out in enumerate(loop.output[n_carried:n_carried + n_scan]):
        if not out:
            continue
        pieces = []
        for step, value in enumerate(scans[k]):
            piece = f"{out}{tag}_{step}"
            if opset >= 13:
                axes = f"{out}{tag}_axes"
                if step == 0:
                    nodes.append(helper.make_node("Constant", [], [axes], name=axes,
                                                  value=numpy_helper.from_array(
                                                      np.array([0], np.int64))))
                nodes.append(helper.make_node("Unsqueeze", [value, axes], [piece], name=piece))
            else:
                nodes.append(helper.make_node("Unsqueeze", [value], [piece], name=piece,
                                              axes=[0]))
            pieces.append(piece)
        nodes.append(helper.make_node("Concat", pieces, [out], name=f"{out}{tag}", axis=0))
    return nodes, conds
