"""The operator graph the planner reasons about.

After legalization every Relax operator in ``main`` is a ``call_tir`` of one PrimFunc
annotated with TVM's op pattern. Each such binding becomes an :class:`OpNode`; a node is
identified by its position among the call_tir bindings, which is stable for a given
module (names are not: legalization reuses PrimFuncs and var names repeat).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir.analysis import estimate_tir_flops

from ..errors import PlanError

# TVM's OpPatternKind values (include/tvm/relax/op_attr_types.h).
_PATTERN_KIND = {0: "elemwise", 1: "broadcast", 2: "injective", 3: "reduction",
                 4: "gemm", 7: "tuple", 8: "opaque"}


@dataclass(frozen=True, kw_only=True)
class OpNode:
    """One TIR operator of the model.

    Attributes
    ----------
    id : int
        Index among the call_tir bindings of ``main``.
    op : str
        Name of the PrimFunc it calls (``conv2d``, ``add1``, ``softmax``...).
    kind : str
        ``elemwise``, ``broadcast``, ``injective``, ``reduction``, ``gemm`` (TVM's
        out-elementwise-fusable: conv, matmul) or ``opaque``.
    inputs : tuple of int
        Ids of the nodes producing its tensor inputs (constants and model inputs excluded).
    shape, dtype :
        Of its output.
    flops : float
        Arithmetic operations, from TIR.
    bytes_read, bytes_written : int
        Its tensor arguments and result, each read or written once.
    """

    id: int
    op: str
    kind: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    flops: float
    bytes_read: int
    bytes_written: int


@dataclass(frozen=True, kw_only=True)
class OpGraph:
    """The legalized module and its operator nodes in topological order."""

    mod: tvm.IRModule
    nodes: tuple[OpNode, ...]
    outputs: tuple[int, ...]  # nodes whose result leaves main

    def consumers(self) -> dict[int, list[int]]:
        """Map each node id to the ids of the nodes that read it."""
        users: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                users[i].append(n.id)
        return users

    @property
    def signature(self) -> str:
        """Hash of the node list; a plan made for another graph is refused by it."""
        rows = [[n.op, n.kind, list(n.inputs), list(n.shape), n.dtype] for n in self.nodes]
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Lower every Relax operator to a call_tir of an annotated PrimFunc."""
    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ])
    return seq(mod)


def _tensor_bytes(ty) -> int:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return 0
    dims = [int(d) for d in ty.shape.values]
    return int(np.prod(dims, dtype=np.int64)) * tvm.DataType(ty.dtype).bits // 8


def call_tir_bindings(mod: tvm.IRModule) -> list[relax.VarBinding]:
    """The call_tir bindings of ``main``'s dataflow block, in order."""
    main = mod["main"]
    blocks = [b for b in main.body.blocks if isinstance(b, relax.DataflowBlock)]
    if len(blocks) != 1:
        _raise_on_control_flow(main)
        raise PlanError(f"expected one dataflow block in main after import, got {len(blocks)}")
    return [b for b in blocks[0].bindings if _is_call_tir(b.value)]


def _raise_on_control_flow(main: relax.Function) -> None:
    """A PlanError naming the inputs a run-time branch (a Relax If) reads, if any."""
    value = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    params = set(main.params)
    for expr in value.values():
        if not isinstance(expr, relax.If):
            continue
        reads, todo, seen = set(), [expr.cond], set()
        while todo:  # walk the condition's producers back to main's parameters
            e = todo.pop()
            for v in relax.analysis.free_vars(e):
                if v in params:
                    reads.add(v.name)
                elif v in value and v not in seen:
                    seen.add(v)
                    todo.append(value[v])
        names = ", ".join(repr(n) for n in sorted(reads)) or "(none found)"
        raise PlanError(
            f"the model branches at run time: an If (from the ONNX model's If) picks its "
            f"branch from the value of input {names}. tvm-fusion plans and tunes one static "
            f"dataflow graph, so control flow on an input's value is not supported. "
            f"Re-export the model with that input fixed (a constant or initializer, e.g. "
            f"one sample rate), so that the If folds to one branch")


def _is_call_tir(expr) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir"


def build_graph(mod: tvm.IRModule, *, legalized: bool = False) -> OpGraph:
    """Legalize a Relax module and build its operator graph.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module with ``main`` (``ImportedModel.mod``).
    legalized : bool
        Skip legalization when ``mod`` already went through :func:`legalize`.

    Returns
    -------
    OpGraph
    """
    if not legalized:
        mod = legalize(mod)
    bindings = call_tir_bindings(mod)
    producer = {b.var: i for i, b in enumerate(bindings)}
    # Tuple/TupleGetItem glue between call_tirs: follow it back to the producing node.
    alias: dict = {}
    main = mod["main"]
    for block in main.body.blocks:
        for b in block.bindings:
            if not _is_call_tir(b.value):
                alias[b.var] = b.value

    def sources(expr) -> list[int]:
        found: list[int] = []

        def visit(e):
            if isinstance(e, relax.Var) and e in producer:
                found.append(producer[e])
            elif isinstance(e, relax.Var) and e in alias:
                relax.analysis.post_order_visit(alias[e], visit)

        relax.analysis.post_order_visit(expr, visit)
        return found

    nodes = []
    for i, b in enumerate(bindings):
        gv, args = b.value.args[0], b.value.args[1]
        func = mod[gv]
        kind = _PATTERN_KIND.get(int(func.attrs.get("op_pattern", 8)), "opaque")
        ins = tuple(dict.fromkeys(j for a in args.fields for j in sources(a)))
        read = sum(_tensor_bytes(a.ty) for a in args.fields)
        written = _tensor_bytes(b.var.ty)
        nodes.append(OpNode(
            id=i, op=gv.name_hint, kind=kind, inputs=ins,
            shape=tuple(int(d) for d in b.var.ty.shape.values), dtype=str(b.var.ty.dtype),
            flops=float(estimate_tir_flops(tvm.IRModule({"main": func}))),
            bytes_read=read, bytes_written=written))
    outputs = tuple(dict.fromkeys(sources(main.body.body)))
    return OpGraph(mod=mod, nodes=tuple(nodes), outputs=outputs)
