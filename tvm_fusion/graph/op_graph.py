"""The operator graph the planner reasons about.

After legalization almost every Relax operator in ``main`` is a ``call_tir`` of one
PrimFunc annotated with TVM's op pattern. Each such binding becomes an :class:`OpNode`; a
node is identified by its position among the node bindings, which is stable for a given
module (names are not: legalization reuses PrimFuncs and var names repeat).

A few operators have no legalization: sort and scan ops (``relax.topk``, ``relax.sort``,
``relax.cumsum``...) are lowered per target by TVM's ``DispatchSortScan`` at build time,
and ops whose output size depends on the data (``NonZero``, ``Unique``) stay packed calls
into TVM's runtime. They are nodes too (``library`` set), always a kernel of their own.

An operator may return a tuple (``Split``: one tensor per piece; ``TopK``: values and
indices). Each tuple element is a :class:`Result` of the node; readers reach it through
``TupleGetItem`` glue, which is not a node and never has to sit inside a group
(``reads`` records which element each reader takes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir.analysis import estimate_tir_flops

from ..errors import LoweringError, PlanError
from ..frontend.int_weights import fold_keeping_int_weights
from .const_divide import LEGALIZE_MAP as _CONST_DIVIDE
from .conv_transpose import LEGALIZE_MAP as _CONV_TRANSPOSE
from .fast_erf import LEGALIZE_MAP as _FAST_ERF
from .fake_quant import fake_quant_in_float
from .layout import LEGALIZE_MAP as _PACKED_CONV
from .pad_columns import LEGALIZE_MAP as _PAD_COLUMNS
from .wide_softmax import LEGALIZE_MAP as _WIDE_SOFTMAX

# TVM's OpPatternKind values (include/tvm/relax/op_attr_types.h).
_PATTERN_KIND = {0: "elemwise", 1: "broadcast", 2: "injective", 3: "reduction",
                 4: "gemm", 7: "tuple", 8: "opaque"}


@dataclass(frozen=True)
class Result:
    """One output tensor of a node (a tuple element for a multi-output op).

    Unknown (data-dependent) dims are -1 in ``shape`` and count as 1 in ``nbytes``.
    """

    shape: tuple[int, ...]
    dtype: str
    nbytes: int


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
        Of its output (the first tuple element of a multi-output op).
    flops : float
        Arithmetic operations, from TIR (0 for a library or data-dependent node).
    bytes_read, bytes_written : int
        Its tensor arguments and results, each read or written once.
    results : tuple of Result
        Every output tensor (one unless the op returns a tuple).
    reads : tuple of (int, int)
        ``(producer id, result index)`` of every node result it reads, once each.
    data_dependent : str
        Why the node cannot share a kernel (its output's size or order depends on the
        data; empty for ordinary operators).
    library : bool
        Not a call_tir: a Relax op lowered by TVM at build time or a runtime call.
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
    results: tuple[Result, ...] = ()
    reads: tuple[tuple[int, int], ...] = ()
    data_dependent: str = ""
    library: bool = False


@dataclass(frozen=True, kw_only=True)
class OpGraph:
    """The legalized module and its operator nodes in topological order."""

    mod: tvm.IRModule
    nodes: tuple[OpNode, ...]
    outputs: tuple[int, ...]  # nodes whose result leaves main
    output_items: tuple[tuple[int, int], ...] = ()  # (node, result index) leaving main

    def result_bytes(self, item: tuple[int, int]) -> int:
        """Bytes of result ``item = (node id, result index)``."""
        node = self.nodes[item[0]]
        return node.results[item[1]].nbytes if node.results else node.bytes_written

    def result_readers(self) -> dict[tuple[int, int], list[int]]:
        """Map each ``(node id, result index)`` read by some node to its readers."""
        users: dict[tuple[int, int], list[int]] = {}
        for n in self.nodes:
            for item in n.reads:
                users.setdefault(item, []).append(n.id)
        return users

    def consumers(self) -> dict[int, list[int]]:
        """Map each node id to the ids of the nodes that read it."""
        users: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                users[i].append(n.id)
        return users

    @cached_property  # the planner's caches look it up per kernel (plcmos: 4000 times)
    def signature(self) -> str:
        """Hash of the node list; a plan made for another graph is refused by it."""
        rows = [[n.op, n.kind, list(n.inputs), list(n.shape), n.dtype]
                + ([[list(r.shape), r.dtype] for r in n.results] if len(n.results) > 1 else [])
                for n in self.nodes]
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Lower every Relax operator to a call_tir of an annotated PrimFunc (a quantize
    read straight back in float first computed in float: :mod:`.fake_quant`)."""
    mod = fake_quant_in_float(mod)
    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.LegalizeOps(customize_legalize_map={**_WIDE_SOFTMAX, **_PACKED_CONV,
                                                              **_FAST_ERF, **_CONV_TRANSPOSE,
                                                              **_CONST_DIVIDE, **_PAD_COLUMNS}),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ])
    try:
        return fold_keeping_int_weights(mod, seq)
    except (AssertionError, ValueError, RuntimeError) as err:
        raise _lowering_error(mod, err) from err


def _lowering_error(mod: tvm.IRModule, err: Exception) -> LoweringError:
    """What TVM's legalization failed on: an op reading a tensor whose size is known
    only at run time (what follows Compress, NonZero, Unique...), or else its message."""
    text = " ".join(str(err).strip().splitlines()[-1:])[:300]
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            call = b.value
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                continue
            unknown = [a for a in call.args if isinstance(a.ty, relax.TensorType)
                       and a.ty.shape is None]
            if unknown and call.op.name not in ("relax.call_pure_packed", "relax.match_cast"):
                return LoweringError(
                    f"TVM {tvm.__version__} cannot lower {call.op.name} (result {b.var.name})"
                    f" of a tensor whose size is known only at run time ({text}). Such a "
                    "tensor comes from an op with a data-dependent output (ONNX Compress, "
                    "NonZero, Unique...) followed by ops TVM has no dynamic-shape lowering "
                    "for: run that part outside the model, or give it a fixed size (e.g. "
                    "TopK with a fixed k instead of a threshold)", kernel=call.op.name)
    return LoweringError(f"TVM {tvm.__version__} cannot legalize the model: {text}")


def _dims(ty) -> tuple[int, ...]:
    """Static dims of a tensor type; -1 for a dim known only at run time."""
    if not isinstance(ty, relax.TensorType):
        return ()
    if ty.shape is None:  # rank known, sizes only at run time (a runtime call's result)
        return (-1,) * max(int(ty.ndim), 0)
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else -1 for d in ty.shape.values)


def _tensor_bytes(ty) -> int:
    if not isinstance(ty, relax.TensorType):
        return 0
    dims = [max(d, 1) for d in _dims(ty)]
    return int(np.prod(dims, dtype=np.int64)) * tvm.DataType(ty.dtype).bits // 8


def _results(ty) -> tuple[Result, ...]:
    fields = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
    return tuple(Result(_dims(f), str(getattr(f, "dtype", "")), _tensor_bytes(f))
                 for f in fields)


def _is_tensor_type(ty) -> bool:
    if isinstance(ty, relax.TupleType):
        return len(ty.fields) > 0 and all(isinstance(f, relax.TensorType) for f in ty.fields)
    return isinstance(ty, relax.TensorType)


def _library_call(expr) -> relax.Call | None:
    """The Relax op or runtime call of a binding value that is a library node, if any."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
            and not _is_call_tir(expr) and _is_tensor_type(expr.ty):
        return expr
    return None


def is_node_binding(binding) -> bool:
    """Whether a binding of ``main`` is a node of the op graph (see the module docstring)."""
    return _is_call_tir(binding.value) or (
        _library_call(binding.value) is not None and _is_tensor_type(binding.var.ty))


def library_op_name(call: relax.Call) -> str:
    """``topk`` for ``relax.topk``, ``nonzero`` for the packed ``relax.run.nonzero``."""
    name = call.op.name
    if name in ("relax.call_pure_packed", "relax.call_dps_packed", "relax.call_packed") \
            and call.args and hasattr(call.args[0], "global_symbol"):
        name = str(call.args[0].global_symbol)
    return name.rsplit(".", 1)[-1]


def call_tir_bindings(mod: tvm.IRModule) -> list:
    """The node bindings of ``main``'s dataflow block, in order (a node's id is its
    index here): every call_tir and every library call (see the module docstring)."""
    main = mod["main"]
    blocks = [b for b in main.body.blocks if isinstance(b, relax.DataflowBlock)]
    if len(blocks) != 1:
        _raise_on_control_flow(main)
        raise PlanError(f"expected one dataflow block in main after import, got {len(blocks)}")
    return [b for b in blocks[0].bindings if is_node_binding(b)]


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
            f"Fix that input as a constant (--const NAME=VALUE, import_model(consts=...), "
            f"e.g. one sample rate), so that the If folds to one branch")


def _is_call_tir(expr) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir"


_SORT_SCAN = ("topk", "sort", "argsort", "cumsum", "cumprod", "bucketize")


def _why_data_dependent(node_op: str, library: bool, results, shape_feeding: bool) -> str:
    if any(d < 0 for r in results for d in r.shape):
        return "its output shape is known only at run time"
    if library and node_op in _SORT_SCAN:
        return "a sort, scan or selection, lowered by TVM's DispatchSortScan for the target"
    if library:
        return "a call into TVM's runtime"
    if shape_feeding:
        return "its result decides a tensor shape at run time"
    return ""


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
    multi = {b.var for b in bindings if isinstance(b.var.ty, relax.TupleType)}
    # Glue between nodes (tuples, TupleGetItem, shape ops): followed back to the nodes.
    alias: dict = {}
    main = mod["main"]
    for block in main.body.blocks:
        for b in block.bindings:
            if b.var not in producer:
                alias[b.var] = b.value

    def items(expr) -> list[tuple[int, int]]:
        """The (node, result index) pairs ``expr`` reads."""
        if isinstance(expr, relax.Var):
            if expr in producer:
                n = producer[expr]
                return ([(n, k) for k in range(len(expr.ty.fields))] if expr in multi
                        else [(n, 0)])
            return items(alias[expr]) if expr in alias else []
        if isinstance(expr, relax.TupleGetItem):
            t = expr.tuple_value
            if isinstance(t, relax.Var) and t in producer and t in multi:
                return [(producer[t], int(expr.index))]
            if isinstance(t, relax.Var) and isinstance(alias.get(t), relax.Tuple):
                return items(alias[t].fields[int(expr.index)])
            return items(t)
        if isinstance(expr, relax.Tuple):
            return [i for f in expr.fields for i in items(f)]
        found: list = []
        relax.analysis.post_order_visit(
            expr, lambda e: found.extend(items(e)) if isinstance(e, relax.Var) else None)
        return found

    # node results that decide a shape at run time (integer chains into tensor_to_shape)
    shape_feeding: set[int] = set()
    todo = [i for v in alias.values() if isinstance(v, relax.Call)
            and getattr(v.op, "name", "") == "relax.tensor_to_shape" for i in items(v)]
    while todo:
        n, k = todo.pop()
        ty = bindings[n].var.ty
        ty = ty.fields[k] if bindings[n].var in multi else ty
        if n not in shape_feeding and "int" in str(ty.dtype):
            shape_feeding.add(n)
            todo += items(bindings[n].value)

    nodes = []
    for i, b in enumerate(bindings):
        results = _results(b.var.ty)
        if _is_call_tir(b.value):
            gv, args = b.value.args[0], list(b.value.args[1].fields)
            func = mod[gv]
            kind = _PATTERN_KIND.get(int(func.attrs.get("op_pattern", 8)), "opaque")
            op, library = gv.name_hint, False
            flops = float(estimate_tir_flops(tvm.IRModule({"main": func})))
        else:
            call = _library_call(b.value)
            args = [a for a in call.args if isinstance(a.ty, (relax.TensorType, relax.TupleType))]
            op, kind, library, flops = library_op_name(call), "opaque", True, 0.0
        reads = tuple(dict.fromkeys(j for a in args for j in items(a)))
        why = _why_data_dependent(op, library, results, i in shape_feeding)
        if not why and any(d < 0 for n, k in reads for d in nodes[n].results[k].shape):
            why = "it reads a tensor whose shape is known only at run time"
        if why:  # TIR loop bounds of such ops are upper bounds, not the work done
            flops = 0.0
        nodes.append(OpNode(
            id=i, op=op, kind="opaque" if why else kind,
            inputs=tuple(dict.fromkeys(n for n, _ in reads)),
            shape=results[0].shape, dtype=results[0].dtype, flops=flops,
            bytes_read=sum(_tensor_bytes(a.ty) if not isinstance(a.ty, relax.TupleType)
                           else sum(_tensor_bytes(f) for f in a.ty.fields) for a in args),
            bytes_written=sum(r.nbytes for r in results),
            results=results, reads=reads, data_dependent=why, library=library))
    out_items = tuple(dict.fromkeys(items(main.body.body)))
    return OpGraph(mod=mod, nodes=tuple(nodes),
                   outputs=tuple(dict.fromkeys(n for n, _ in out_items)),
                   output_items=out_items)
