"""The pattern library: names for the canonical chains a fused group can be.

Patterns name groups, they do not make them: the planner fuses by predicted time, then
:func:`match_pattern` reads the group's operators in topological order as a sequence of
stages (``Conv``, ``BN``, ``Bias``, ``Residual``, an activation, ``Scale``, a pooling,
``Softmax``...) and names the chain when every operator belongs to a stage. Families:

==========================  =====================================================
family                      example chains (as legalized by TVM)
==========================  =====================================================
Conv-BN-activation          Conv-BN-ReLU, Conv-BN-Residual-HardSwish, Conv-Bias-ReLU6
MatMul-Bias-activation      MatMul-Bias-GELU, MatMul-Bias-SiLU, MatMul-Bias-HardSwish
LayerNorm                   Bias-Residual-LayerNorm, MatMul-Bias-Residual-LayerNorm
Softmax                     Softmax, MatMul-Bias-Softmax (a classifier head)
attention score path        MatMul-Scale-Mask-Softmax
squeeze-excite gate         Conv-Bias-HardSigmoid-Scale (the gate times the features)
int8 GEMM                   Conv-ZeroPoint-Dequantize-Scale-BN-HardSwish-Requantize
                            (an integer GEMM, simplify/qdq.py: the activation's zero
                            point, the int32 -> float cast and the scales in the
                            epilogue, then requantize)
==========================  =====================================================

Operators are recognised by their PrimFunc's base name (``add3`` -> ``add``, ``tir_clip``
-> ``clip``) and by structure (an ``add`` of a constant is a bias; of two full-size
tensors, computed or model inputs, a residual; of a broadcast tensor, a mask).

On a simplified graph (:mod:`tvm_fusion.simplify`) the chains have lost operators to
folding, and keep their names: a batch norm folded into a conv or matmul is the bias
add :mod:`~tvm_fusion.simplify.affine` names ``bn_folded`` (``Conv-BN-ReLU``); GELU
without its final ``* 0.5`` (folded into the next matmul); HardSwish without its
``/ 6`` (folded into the next conv: ``x * clip(x + 3, 0, 6)``); HardSigmoid whose scale
and shift went into the conv's weights (a clip to ``[0, 1]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm

from ..graph import OpGraph
from ..graph.op_graph import call_tir_bindings
from ..simplify.affine import FOLDED_BN
from ..simplify.block import const_value

FAMILIES = ("Conv-BN-activation", "MatMul-Bias-activation", "LayerNorm", "Softmax",
            "attention score path", "squeeze-excite gate", "int8 GEMM")
_CLIP = (("clip",), ("maximum", "minimum"))
_ACT_SEQS = {  # stage -> op sequences; the first item of a HardSwish is the "+ 3"
    "HardSwish": [("add", *c, *t) for c in _CLIP
                  for t in (("divide", "multiply"), ("multiply", "divide"))],
    "HardSigmoid": [("multiply", "add", *c) for c in _CLIP]
                   + [("add", *c, "divide") for c in _CLIP],
    # the 4-op forms: x * (1 + erf(x / sqrt 2)), the 0.5 folded into the next matmul
    "GELU": [("divide", "erf", "add", "multiply", "multiply"),
             ("multiply", "erf", "add", "multiply", "multiply"),
             ("divide", "erf", "add", "multiply"), ("multiply", "erf", "add", "multiply")],
    "SiLU": [("sigmoid", "multiply")],
    "BN": [("subtract", "divide", "multiply", "add")],
}
_SINGLE = {"relu": "ReLU", "clip": "ReLU6", "sigmoid": "Sigmoid", "tanh": "Tanh",
           "softmax": "Softmax", "layer_norm": "LayerNorm", "max_pool2d": "MaxPool",
           "avg_pool2d": "AvgPool", "reshape": "Reshape", "transpose": "Transpose",
           "quantize": "Requantize", "dequantize": "Dequantize", "cast": "Dequantize",
           # a quantize read back in float (graph/fake_quant.py): the rounding to the grid
           "fake_quantize": "Requantize",
           "pad": "Pad", "split": "Split", "layout_transform": "LayoutTransform"}
_ANCHORS = {"conv1d": "Conv", "conv2d": "Conv", "conv3d": "Conv", "conv2d_NCHWc": "Conv",
            "matmul": "MatMul",
            "dense": "MatMul", "batch_matmul": "MatMul"}
_NAMED_ALONE = ("Softmax", "LayerNorm")
_MOVES = ("Split", "Reshape", "Transpose")  # repeats of one are one stage (Q/K/V pieces)


@dataclass(frozen=True, kw_only=True)
class PatternMatch:
    """A group read as a chain of stages.

    Attributes
    ----------
    stages : tuple of str
        ``("Conv", "BN", "HardSwish")``.
    family : str
        One of :data:`FAMILIES`, or ``""`` for a chain outside them.
    """

    stages: tuple[str, ...]
    family: str

    @property
    def name(self) -> str:
        """``attention score path (MatMul-Scale-Mask-Softmax)``, or the chain itself."""
        chain = "-".join(self.stages)
        return f"{self.family} ({chain})" if self.family in FAMILIES[4:] else chain


def base_op(op: str) -> str:
    """``add3`` -> ``add``, ``tir_clip`` -> ``clip``, ``conv2d1`` -> ``conv2d``."""
    op = op.removeprefix("tir_")
    return op if re.fullmatch(r"conv\dd", op) else re.sub(r"(?<=[a-z_])\d+$", "", op)


_CONSTANT_READERS: dict[str, tuple] = {}


def _reads_constant(graph: OpGraph) -> frozenset:
    """Ids of the nodes with a constant operand (a weight, a bias), cached per graph's
    module (two graphs of one signature may differ in what is a constant)."""
    key = graph.signature
    if key not in _CONSTANT_READERS or _CONSTANT_READERS[key][0] is not graph.mod:
        _CONSTANT_READERS[key] = (graph.mod, frozenset(
            i for i, b in enumerate(call_tir_bindings(graph.mod))
            if not graph.nodes[i].library
            and any(isinstance(a, tvm.ir.Constant) for a in b.value.args[1].fields)))
    return _CONSTANT_READERS[key][1]


_FACTS: dict[str, tuple] = {}
_FLOAT_IMM = re.compile(r"T\.float(?:16|32|64)\(([-+0-9.eE]+|inf)\)")


def _facts(graph: OpGraph) -> tuple[frozenset, dict]:
    """(ids of the folded batch norms' bias adds, id -> the scalar constants a node reads:
    immediates in its PrimFunc and one-element constant operands), cached per graph (the
    module, not only the signature: var names and constants are not in the signature)."""
    key = graph.signature
    if key not in _FACTS or _FACTS[key][0] is not graph.mod:
        folded, scalars = set(), {}
        for i, b in enumerate(call_tir_bindings(graph.mod)):
            if graph.nodes[i].library:
                continue
            if re.fullmatch(rf"{FOLDED_BN}\d*", b.var.name):  # printers number repeats
                folded.add(i)
            if base_op(graph.nodes[i].op) in ("clip", "minimum", "maximum"):
                values = [const_value(a) for a in b.value.args[1].fields]
                found = [float(v.reshape(-1)[0]) for v in values
                         if v is not None and v.size == 1]
                # immediates (tir_clip's bounds): 0.27's Python has no TIR visitor
                found += [float(v) for v in _FLOAT_IMM.findall(
                    graph.mod[b.value.args[0]].script())]
                scalars[i] = found
        _FACTS[key] = (graph.mod, (frozenset(folded), scalars))
    return _FACTS[key][1]


def _clip_stage(graph: OpGraph, clip_ids) -> str:
    """``HardSigmoid`` for a clip to [0, 1] (its scale and shift folded away), else
    ``ReLU6``."""
    bounds = [v for n in clip_ids for v in _facts(graph)[1].get(n, ())]
    return "HardSigmoid" if bounds and max(bounds) == 1.0 and min(bounds) == 0.0 else "ReLU6"


def _folded_hardswish(graph: OpGraph, nodes, i: int, ops) -> int:
    """Operators of ``x * clip(x + 3, 0, 6)`` (HardSwish whose ``/ 6`` was folded into the
    next conv) starting at ``nodes[i]``, or 0."""
    for clip in _CLIP:
        seq = ("add", *clip, "multiply")
        if tuple(ops[i:i + len(seq)]) != seq:
            continue
        add, mul = graph.nodes[nodes[i]], graph.nodes[nodes[i + len(seq) - 1]]
        if add.inputs and add.inputs[0] in mul.inputs and _clip_stage(
                graph, nodes[i + 1:i + 1 + len(clip)]) == "ReLU6":
            return len(seq)
    return 0


def _stage(graph: OpGraph, nodes, i: int, stages: list[str]) -> tuple[str, int] | None:
    """The stage starting at ``nodes[i]`` and how many operators it takes, or None."""
    ops = [base_op(graph.nodes[n].op) for n in nodes]
    for stage, seqs in _ACT_SEQS.items():
        for seq in seqs:
            if tuple(ops[i:i + len(seq)]) == seq:
                return stage, len(seq)
    n_swish = _folded_hardswish(graph, nodes, i, ops)
    if n_swish:
        return "HardSwish", n_swish
    op, node = ops[i], graph.nodes[nodes[i]]
    const = nodes[i] in _reads_constant(graph)
    nxt = ops[i + 1] if i + 1 < len(ops) else ""
    if op in _ANCHORS:
        return _ANCHORS[op], 1
    full = node.bytes_read >= 2 * node.bytes_written  # two operands of the output's size
    if op == "add" and nodes[i] in _facts(graph)[0]:
        return "BN", 1  # a batch norm folded into the conv/matmul before it
    if op == "add":
        return ("Bias" if const else "Residual" if full else "Mask"), 1
    if op == "subtract" and stages and stages[-1] in ("Conv", "MatMul") \
            and graph.nodes[nodes[i]].dtype == "int32":
        return "ZeroPoint", 1  # an integer GEMM's activation zero-point correction
    if op in ("divide", "multiply"):
        # by a constant or an immediate: 1 / sqrt(d) of attention scores; by a tensor
        # after a stage: a gate times the features (squeeze-excite after a sigmoid)
        return ("Scale", 1) if stages or const or not full else None
    if op == "mean":
        shape = node.shape
        pool = len(shape) == 4 and shape[2] == shape[3] == 1
        return ("GlobalAvgPool" if pool else "Mean"), 1
    if op == "clip" or (op, nxt) == ("maximum", "minimum"):
        k = 1 if op == "clip" else 2
        return _clip_stage(graph, nodes[i:i + k]), k
    if op in _SINGLE:
        return _SINGLE[op], 1
    return None


def _family(stages: tuple[str, ...]) -> str:
    gemm = [k for k, s in enumerate(stages) if s in ("Conv", "MatMul")]
    if gemm and {"ZeroPoint", "Dequantize", "Requantize"} & set(stages[gemm[0]:]):
        return "int8 GEMM"
    acts = {"ReLU", "ReLU6", "HardSwish", "HardSigmoid", "GELU", "SiLU", "Sigmoid", "Tanh"}
    if "MatMul" in stages and "Softmax" in stages and {"Scale", "Mask"} & set(stages):
        return "attention score path"
    gate = [k for k, s in enumerate(stages) if s in ("HardSigmoid", "Sigmoid")]
    if gate and "Scale" in stages[gate[0]:]:
        return "squeeze-excite gate"
    if "LayerNorm" in stages:
        return "LayerNorm"
    if "Softmax" in stages:
        return "Softmax"
    if stages[0] == "Conv" and (acts | {"BN", "Bias", "Residual"}) & set(stages[1:]):
        return "Conv-BN-activation"
    if stages[0] == "MatMul" and (acts | {"Bias"}) & set(stages[1:]):
        return "MatMul-Bias-activation"
    return ""


def match_pattern(graph: OpGraph, nodes) -> PatternMatch | None:
    """Read the group ``nodes`` as a chain of stages; None when an operator fits none.

    Single operators are matched only when the library names them (Softmax,
    LayerNorm).
    """
    nodes = sorted(nodes)
    stages: list[str] = []
    i = 0
    while i < len(nodes):
        found = _stage(graph, nodes, i, stages)
        if found is None:
            return None
        if not (found[0] in _MOVES and stages and stages[-1] == found[0]):
            stages.append(found[0])
        i += found[1]
    if len(nodes) == 1 and stages[0] not in _NAMED_ALONE:
        return None
    return PatternMatch(stages=tuple(stages), family=_family(tuple(stages)))
