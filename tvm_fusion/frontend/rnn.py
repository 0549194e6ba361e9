"""ONNX LSTM, GRU and RNN, unrolled into plain ONNX ops before TVM's importer sees them.

TVM 0.27's Relax ONNX importer has no converter for the recurrent ops. Once the input
shapes are fixed the sequence length is known, so each recurrent node becomes its
unrolled loop (opsets 7-22, the ONNX operator spec's equations): for every direction the
input projections of all time steps and gates are one MatMul (``X @ W^T + b``), and each
step adds one MatMul of the previous hidden state for all gates, splits the gates and
applies their activations. Only ops whose form is the same in every opset from 7 on are emitted
(MatMul, Add, Mul, Sub, Reshape, Concat, Transpose, Min, Max and the activations), and
Split in the form of the model's opset, so the result is valid at that opset. The weights must be
constants (they are in every exported model); ``sequence_lens``, when given, must be the
full length for every batch entry.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tvm_fusion.errors import UnsupportedOpError

from .fold import default_opset, static_shape

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_TAKES_ALPHA = {"LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu", "Affine"}
_TAKES_BETA = {"ScaledTanh", "HardSigmoid", "Affine"}
_ALPHA = {"LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "HardSigmoid": 0.2, "Elu": 1.0,
          "ScaledTanh": 1.0, "Affine": 1.0}
_BETA = {"HardSigmoid": 0.5, "ScaledTanh": 1.0, "Affine": 0.0}


class _Emitter:
    """Appends nodes and constants with names unique to one recurrent node."""

    def __init__(self, prefix: str, dtype, opset: int):
        self.prefix, self.dtype, self.n, self.opset = prefix, dtype, 0, opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def name(self) -> str:
        self.n += 1
        return f"{self.prefix}/{self.n}"

    def const(self, value, dtype=None) -> str:
        name = self.name()
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype or self.dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self.name()
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def split(self, x: str, axis: int, sizes) -> list[str]:
        """``x`` cut along ``axis`` into pieces of ``sizes`` (Split takes its sizes as an
        attribute before opset 13, as an input from 13 on)."""
        if len(sizes) == 1:
            return [x]
        outs = [self.name() for _ in sizes]
        if self.opset < 13:
            node = helper.make_node("Split", [x], outs, name=outs[0] + "_split", axis=axis,
                                    split=list(sizes))
        else:
            node = helper.make_node("Split", [x, self.const(list(sizes), np.int64)], outs,
                                    name=outs[0] + "_split", axis=axis)
        self.nodes.append(node)
        return outs

    def reshape(self, x: str, shape) -> str:
        return self.op("Reshape", x, self.const(list(shape), np.int64))

    def act(self, kind: str, x: str, alpha: float, beta: float) -> str:
        if kind in ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"):
            return self.op(kind, x)
        if kind in ("LeakyRelu", "Elu", "ThresholdedRelu"):
            return self.op(kind, x, alpha=alpha)
        if kind == "HardSigmoid":
            return self.op(kind, x, alpha=alpha, beta=beta)
        if kind == "Affine":
            return self.op("Add", self.op("Mul", x, self.const(alpha)), self.const(beta))
        if kind == "ScaledTanh":
            return self.op("Mul", self.op("Tanh", self.op("Mul", x, self.const(beta))),
                           self.const(alpha))
        raise ValueError(kind)


def expand_recurrent(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """A copy of ``model`` with every top-level LSTM, GRU and RNN node unrolled (the
    model itself when it has none).

    Raises
    ------
    UnsupportedOpError
        A recurrent node this expansion cannot unroll (weights computed at run time,
        ragged ``sequence_lens``, an unknown activation, an unknown sequence length),
        naming the node and why.
    """
    if not any(n.op_type in RECURRENT_OPS and n.domain in ("", "ai.onnx")
               for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    consts = {t.name: t for t in graph.initializer}
    shapes = {i.name: static_shape(i) for i in (*graph.input, *graph.value_info, *graph.output)}
    shapes.update({t.name: tuple(t.dims) for t in graph.initializer})
    nodes = []
    for node in graph.node:
        if node.op_type not in RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        em = _unroll(node, consts, shapes, source, default_opset(model))
        nodes += em.nodes
        graph.initializer.extend(em.inits)
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _fail(node, source, why: str):
    label = node.name or f"<unnamed, output {node.output[0]}>"
    return UnsupportedOpError(
        f"{source}: {node.op_type} node {label!r} cannot be unrolled for TVM (its importer has "
        f"no {node.op_type}): {why}. Re-export the model with that fixed.")


def _unroll(node, consts, shapes, source, opset) -> _Emitter:
    op = node.op_type
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ins = list(node.input) + [""] * (8 - len(node.input))
    for what, name in (("W", ins[1]), ("R", ins[2]), ("B", ins[3]), ("P", ins[7])):
        if name and name not in consts:
            raise _fail(node, source, f"its {what} is computed at run time, not a constant")
    x_shape = shapes.get(ins[0])
    if not x_shape:
        raise _fail(node, source, "the shape of its input X is not static (fix it with --shape)")
    layout = int(attrs.get("layout", 0))
    seq, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    if ins[4]:
        lens = consts.get(ins[4])
        if lens is None or np.any(numpy_helper.to_array(lens) != seq):
            raise _fail(node, source, "its sequence_lens is not the full length for every "
                                      "batch entry")
    W = numpy_helper.to_array(consts[ins[1]])
    R = numpy_helper.to_array(consts[ins[2]])
    dirs, hidden = W.shape[0], int(attrs.get("hidden_size", R.shape[-1]))
    gates = _GATES[op]
    B = (numpy_helper.to_array(consts[ins[3]]) if ins[3]
         else np.zeros((dirs, 2 * gates * hidden), W.dtype))
    P = numpy_helper.to_array(consts[ins[7]]) if op == "LSTM" and ins[7] else None
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    acts = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", ())]
    acts = acts or _DEFAULT_ACTS[op] * dirs
    alphas, betas = list(attrs.get("activation_alpha", ())), list(attrs.get("activation_beta", ()))
    params = []
    for kind in acts:
        if kind not in ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus", *_TAKES_ALPHA):
            raise _fail(node, source, f"activation {kind} is not an ONNX RNN activation")
        a = alphas.pop(0) if kind in _TAKES_ALPHA and alphas else _ALPHA.get(kind, 0.0)
        b = betas.pop(0) if kind in _TAKES_BETA and betas else _BETA.get(kind, 0.0)
        params.append((kind, a, b))
    per_dir = len(_DEFAULT_ACTS[op])
    em = _Emitter(f"{node.name or node.output[0]}_unrolled", W.dtype, opset)
    x = em.op("Transpose", ins[0], perm=[1, 0, 2]) if layout else ins[0]
    # initial states: [dirs, batch, hidden] (layout 0) or [batch, dirs, hidden]
    # states are [1, batch, hidden] throughout: MatMul broadcasts over the leading 1
    h0, c0 = (em.split(em.op("Transpose", s, perm=[1, 0, 2]) if layout else s, 0, [1] * dirs)
              if s else [em.const(np.zeros((1, batch, hidden)))] * dirs for s in ins[5:7])
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        step = _Step(op, em, R[d], B[d], P[d] if P is not None else None, hidden, batch,
                     params[d * per_dir:(d + 1) * per_dir], attrs)
        h, c = h0[d], c0[d]
        # the input projections of all steps and gates: one MatMul, [seq, batch, G*hidden]
        xw = em.op("Add", em.op("MatMul", x, em.const(W[d].T)), step.x_bias)
        xs = em.split(xw, 0, [1] * seq)
        outs = [None] * seq
        for t in (reversed(range(seq)) if reverse else range(seq)):
            h, c = step(xs[t], h, c)
            outs[t] = h
        y = em.op("Concat", *outs, axis=0) if seq > 1 else outs[0]
        ys.append(em.reshape(y, (seq, 1, batch, hidden)))
        hs.append(h)
        cs.append(c)
    results = [em.op("Concat", *ys, axis=1) if dirs > 1 else ys[0],
               em.op("Concat", *hs, axis=0) if dirs > 1 else hs[0],
               em.op("Concat", *cs, axis=0) if dirs > 1 else cs[0]]
    if layout:  # Y [batch, seq, dirs, hidden]; Y_h, Y_c [batch, dirs, hidden]
        results = [em.op("Transpose", results[0], perm=[2, 0, 1, 3]),
                   *(em.op("Transpose", r, perm=[1, 0, 2]) for r in results[1:])]
    for name, value in zip(node.output, results):
        if name:
            em.nodes.append(helper.make_node("Identity", [value], [name], name=f"{em.prefix}/{name}"))
    return em


class _Step:
    """One time step of one direction (the ONNX spec's equations; gate order as in W):
    one MatMul of the hidden state for all gates, then a Split into the gates."""

    def __init__(self, op, em, r, b, p, hidden, batch, acts, attrs):
        self.op, self.em, self.hidden, self.acts = op, em, hidden, acts
        gates = _GATES[op]
        wb, rb = b[:gates * hidden], b[gates * hidden:]
        self.lbr = op == "GRU" and bool(attrs.get("linear_before_reset", 0))
        if op == "GRU":  # z and r share one MatMul; h's reads r * H (or r * (H R_h^T + Rb_h))
            self.r_zr, self.r_h = em.const(r[:2 * hidden].T), em.const(r[2 * hidden:].T)
            bias = wb + np.concatenate([rb[:2 * hidden], 0 * rb[2 * hidden:] if self.lbr
                                        else rb[2 * hidden:]])
            self.rb_h = em.const(rb[2 * hidden:]) if self.lbr else None
        else:
            self.r_all = em.const(r.T)
            bias = wb + rb
        self.x_bias = em.const(bias)
        self.peep = [em.const(p[k * hidden:(k + 1) * hidden]) for k in range(3)] \
            if p is not None else None
        clip = attrs.get("clip")
        self.clip = (em.const(np.full((1, batch, hidden), clip)),
                     em.const(np.full((1, batch, hidden), -clip))) if clip is not None else None
        self.input_forget = bool(attrs.get("input_forget", 0))

    def _act(self, k, x):
        # the cell clip bounds the gates' inputs, not the cell state LSTM's h() reads
        if self.clip is not None and not (self.op == "LSTM" and k == 2):
            x = self.em.op("Max", self.em.op("Min", x, self.clip[0]), self.clip[1])
        kind, a, b = self.acts[k]
        return self.em.act(kind, x, a, b)

    def __call__(self, xt, h, c):
        em, hid = self.em, self.hidden
        if self.op == "RNN":
            return self._act(0, em.op("Add", xt, em.op("MatMul", h, self.r_all))), c
        if self.op == "GRU":
            x_zr, x_h = em.split(xt, 2, [2 * hid, hid])
            pre_z, pre_r = em.split(em.op("Add", x_zr, em.op("MatMul", h, self.r_zr)), 2,
                                    [hid, hid])
            z, r = self._act(0, pre_z), self._act(0, pre_r)
            if self.rb_h is None:
                rec = em.op("MatMul", em.op("Mul", r, h), self.r_h)
            else:
                rec = em.op("Mul", r, em.op("Add", em.op("MatMul", h, self.r_h), self.rb_h))
            cand = self._act(1, em.op("Add", x_h, rec))
            one_minus_z = em.op("Sub", em.const(np.ones((1,))), z)
            return em.op("Add", em.op("Mul", one_minus_z, cand), em.op("Mul", z, h)), c
        # LSTM, gates i, o, f, c; peepholes P = [Pi, Po, Pf]
        pre_i, pre_o, pre_f, pre_c = em.split(
            em.op("Add", xt, em.op("MatMul", h, self.r_all)), 2, [hid] * 4)
        if self.peep is not None:
            pre_i = em.op("Add", pre_i, em.op("Mul", c, self.peep[0]))
            pre_f = em.op("Add", pre_f, em.op("Mul", c, self.peep[2]))
        i = self._act(0, pre_i)
        f = em.op("Sub", em.const(np.ones((1,))), i) if self.input_forget else self._act(0, pre_f)
        c_new = em.op("Add", em.op("Mul", f, c), em.op("Mul", i, self._act(1, pre_c)))
        if self.peep is not None:
            pre_o = em.op("Add", pre_o, em.op("Mul", c_new, self.peep[1]))
        o = self._act(0, pre_o)
        return em.op("Mul", o, self._act(2, c_new)), c_new
