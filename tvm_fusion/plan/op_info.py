"""What the cost model needs to know about one operator beyond its :class:`OpNode`.

Read from the operator's PrimFunc in the legalized module:

``role``
    ``contraction`` (conv, matmul: a reducing block that reads two tensors along the
    reduce axis),
    ``reduction`` (sum, mean, max, softmax, layer norm: a reducing block over one
    tensor), ``elementwise`` (TVM's elemwise, broadcast and injective kinds) or
    ``opaque``. TVM's own pattern calls softmax and mean "out-elementwise-fusable" like
    a matmul; the planner must not treat them as GEMM anchors.
``passes``
    How many blocks of the PrimFunc read its main input (the largest tensor it reads):
    1 for sum/mean, 2 for softmax (max, then exp) and layer norm (moments, then
    normalize). A fused producer of a multi-pass reduction must be kept on chip or
    recomputed once per pass.
``reduce_len``
    Extent of the reduction (product of the reduce iterators of the first reducing
    block that reads the main input): the row length of a reduction, the K of a GEMM.
``rows``
    Independent rows of a reduction: main-input elements / ``reduce_len`` (1 for the
    other roles).
``transcendental``
    FLOPs its math calls cost beyond the one each that ``estimate_tir_flops`` counts:
    per call, :data:`CALL_FLOPS` (the vector instructions of TVM's lowering: ``exp``
    and ``erf`` polynomials; ``log`` and ``pow`` scalar libm calls, one per lane, except
    a ``pow`` whose constant exponent LLVM folds: 1, 2, 0.5, -1) less one, times the
    calling block's iterations. chars2vec's LSTM cells (sigmoid, tanh)
    were priced 9-74x under (benchmarks/RESULTS.md run 14).
``horizontal``
    A reduction along its main input's innermost (contiguous) axis: a layer norm's or
    an NCHW global pool's mean. Each row sums into one scalar, so its loads cannot be
    kept in vector lanes of independent outputs; a reduction over an outer axis (an
    NCHW16c mean, a sum over rows) or a pool window (its innermost index also follows
    the output's: ``w * stride + rw``) vectorizes along the kept innermost axis.
    Measured: 15-58 GB/s for the former, 42-290 GB/s for the latter, against a copy's
    133 (benchmarks/RESULTS.md run 23).
``strided``
    An elementwise op that reads an input across its innermost axis: the innermost
    index of some input it reads does not follow the innermost index of what it writes
    (a transpose or layout change that moves the innermost axis: NCHW to NCHW16c and
    back). Each vector of its output gathers from as many cache lines.
``short_rows``
    It keeps the innermost axis but permutes the next one out, in rows of at most
    ``SHORT_RUN_BYTES``: each row is a stream too short to run at the copy rate
    (MiniLM's head merge, [12, 128, 32] -> [128, 12, 32], moved 31 GB/s against 133).
    Written from a GEMM's register tile it costs nothing more (MiniLM's Q projection
    with its head split: 168 us, the output projection without one: 164).
``fills``
    Some of its output elements read none of its inputs, or another input than the
    rest (a pad's border, a concatenate): its stored value selects with
    ``if_then_else``. MetaSchedule computes such an op at the tile of a GEMM/conv
    before it, where it writes only the tile's image (:mod:`.legality`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import tvm
from tvm import s_tir

from ..graph import OpGraph, OpNode

_ELEMENTWISE_KINDS = ("elemwise", "broadcast", "injective")
_REDUCE_ITER = 2  # tir IterVar.CommReduce
# vector FLOPs per element of a math call as TVM lowers it on a CPU (compat/fast_math.py:
# exp and erf as polynomials; tanh and sigmoid around an exp; log and pow as scalar
# libm calls, ~10 per lane of a 16-lane vector)
CALL_FLOPS = {"exp": 16, "exp2": 16, "erf": 24, "tanh": 20, "sigmoid": 20, "log": 160,
              "log2": 160, "log10": 160, "pow": 160, "sqrt": 4, "rsqrt": 4}
_CALL = re.compile(r"\bT\.(" + "|".join(CALL_FLOPS) + r")\(")
# pow with these constant exponents is no libm call: LLVM folds it to x, x * x, sqrt(x)
# and 1 / x (measured: pow(x, 2.0) as fast as pow(x, 1.0), pow(x, 3.0) 90x slower)
_FOLDED_POW = {1.0: 1, 2.0: 1, 0.5: CALL_FLOPS["sqrt"], -1.0: CALL_FLOPS["sqrt"]}
_FLOAT_CONST = re.compile(r"\s*T\.float(?:16|32|64)\((-?[0-9.e+-]+)\)\s*$")
_NCHW_CONV_BLOCKS = ("conv2d_nchw", "group_conv2d_nchw")  # TOPI's compute names


@dataclass(frozen=True, kw_only=True)
class OpInfo:
    """Derived facts of one node (see the module docstring)."""

    role: str
    passes: int = 1
    reduce_len: int = 1
    rows: int = 1
    in_bytes: int = 0  # bytes of the main input
    out_elems: int = 1
    dtype_bytes: int = 4
    fills: bool = False
    horizontal: bool = False
    strided: bool = False
    short_rows: bool = False
    transcendental: float = 0.0
    nchw_conv: bool = False  # a conv in NCHW: TOPI's conv2d_nchw / group_conv2d_nchw block


def _elems(shape) -> int:
    # a dim known only at run time (-1) counts as 1
    return int(np.prod([max(int(d), 1) for d in shape], dtype=np.int64))


@lru_cache(maxsize=8)  # one op's facts read its PrimFunc's blocks several times
def _blocks(func):
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    root = sch.get_sblock("root")
    allocs = {b.name for b in sch.get(root).alloc_buffers}
    return [sch.get(b) for b in sch.get_child_blocks(root)], allocs


def _transcendental(func) -> float:
    """The ``transcendental`` FLOPs of ``func`` (see the module docstring)."""
    blocks, _ = _blocks(func)
    total = 0.0
    for b in blocks:
        body = str(b.body)
        extra = sum(_call_flops(body, m) - 1 for m in _CALL.finditer(body))
        if extra:
            total += extra * float(np.prod([max(int(iv.dom.extent), 1)
                                            for iv in b.iter_vars], dtype=np.float64))
    return total


def _call_flops(body: str, match: re.Match) -> int:
    """:data:`CALL_FLOPS` of the call ``match`` finds in ``body``, or less for a ``pow``
    with a constant exponent LLVM folds (:data:`_FOLDED_POW`)."""
    name = match.group(1)
    if name != "pow":
        return CALL_FLOPS[name]
    depth, comma = 1, None
    for k in range(match.end(), len(body)):  # the exponent: after the top-level comma
        ch = body[k]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                exponent = _FLOAT_CONST.match(body[comma + 1:k]) if comma else None
                try:
                    return _FOLDED_POW.get(float(exponent.group(1)), CALL_FLOPS["pow"])
                except (AttributeError, ValueError):  # no constant exponent
                    return CALL_FLOPS["pow"]
        elif ch == "," and depth == 1:
            comma = k
    return CALL_FLOPS["pow"]


def _selects(func) -> bool:
    """Whether a block of ``func`` stores an ``if_then_else`` (pad, concatenate)."""
    blocks, _ = _blocks(func)
    return any("if_then_else" in str(b.body) for b in blocks)


def _uses(expr, var) -> bool:
    """Whether index expression ``expr`` mentions iterator ``var`` (by its name)."""
    return re.search(rf"\b{re.escape(var.name)}\b", str(expr)) is not None


SHORT_RUN_BYTES = 128  # two cache lines: a transpose's rows this short stream like a gather


def _strided(func) -> tuple[bool, bool]:
    """``(strided, short_rows)`` of ``func`` (see the module docstring). Strided: a
    block reads an input whose innermost extent is over 1 and whose innermost index
    does not use the iterator of the output's innermost index. Short rows: it does, but
    the next index out does not follow the output's, and the rows are at most
    ``SHORT_RUN_BYTES`` long."""
    blocks, allocs = _blocks(func)
    short = False
    for b in blocks:
        if len(b.writes) != 1 or not b.writes[0].region:
            continue
        region = b.writes[0].region
        inner = [iv.var for iv in b.iter_vars if _uses(region[-1].min, iv.var)]
        if not inner:
            continue
        outer = [iv.var for iv in b.iter_vars if len(region) > 1 and
                 _uses(region[-2].min, iv.var) and iv.var not in inner]
        for r in b.reads:
            if r.source.name in allocs or not r.region:
                continue
            shape = r.source.shape
            extent = shape[-1]
            if not isinstance(extent, tvm.tirx.IntImm) or int(extent) <= 1:
                continue
            if not any(_uses(r.region[-1].min, v) for v in inner):
                return True, False
            row_bytes = int(extent) * max(tvm.DataType(r.source.dtype).bits // 8, 1)
            short = short or (outer and len(r.region) > 1 and row_bytes <= SHORT_RUN_BYTES
                              and isinstance(shape[-2], tvm.tirx.IntImm)
                              and int(shape[-2]) > 1
                              and not any(_uses(r.region[-2].min, v) for v in outer))
    return False, bool(short)


def _reduced_operands(block, reduce_ivs) -> set[str]:
    """Buffers a block reads along a reduce iterator: two for a GEMM/conv (A[i, k] and
    B[k, j]), one for sum/softmax/layer norm (which also read per-row statistics)."""
    return {r.source.name for r in block.reads
            if any(_uses(rng.min, iv.var) for rng in r.region for iv in reduce_ivs)}


def op_info(graph: OpGraph, node: OpNode) -> OpInfo:
    """Classify ``node`` and read its passes and reduction length from its PrimFunc."""
    # every result of a multi-output op (a Split writes all its pieces)
    out_elems = sum(_elems(r.shape) for r in node.results) if node.results else _elems(node.shape)
    dbytes = max(tvm.DataType(node.dtype).bits // 8, 1)
    try:
        math = 0.0 if node.library else _transcendental(graph.mod[node.op])
    except (KeyError, ValueError, AttributeError, RuntimeError):  # not a PrimFunc here
        math = 0.0
    if node.kind in _ELEMENTWISE_KINDS:
        # TVM marks a pad that only grows the high edge elementwise (op_pattern 0: it
        # reads A[i] for each output i, guarded); its border fills all the same
        # (PP-OCRv6's conv + ReLU + pad kernels had wrong rule defaults)
        fills = not node.library and (node.kind == "injective" or (
            node.kind == "elemwise" and any(graph.nodes[i].shape != node.shape
                                            for i in node.inputs))) \
            and _selects(graph.mod[node.op])
        strided, short_rows = _strided(graph.mod[node.op]) \
            if not node.library and node.kind == "injective" else (False, False)
        return OpInfo(role="elementwise", out_elems=out_elems, dtype_bytes=dbytes,
                      fills=fills, strided=strided, short_rows=short_rows,
                      transcendental=math)
    if node.kind not in ("reduction", "gemm"):
        return OpInfo(role="opaque", out_elems=out_elems, dtype_bytes=dbytes,
                      transcendental=math)
    blocks, allocs = _blocks(graph.mod[node.op])
    inputs = {r.source.name: r.source for b in blocks for r in b.reads
              if r.source.name not in allocs}
    if not inputs:
        return OpInfo(role="opaque", out_elems=out_elems, dtype_bytes=dbytes)
    main = max(inputs.values(), key=lambda buf: _elems(buf.shape))
    in_elems = _elems(main.shape)
    readers = {b.name_hint for b in blocks if any(r.source.name == main.name for r in b.reads)}
    role, reduce_len, horizontal = "reduction", 0, False
    for b in blocks:
        red_ivs = [iv for iv in b.iter_vars if int(iv.iter_type) == _REDUCE_ITER]
        if not red_ivs:
            continue
        red = [int(iv.dom.extent) for iv in red_ivs]
        if len(_reduced_operands(b, red_ivs)) >= 2:
            role, reduce_len = "contraction", int(np.prod(red))
            break
        if b.name_hint in readers and not reduce_len:
            reduce_len = int(np.prod(red))
            # the innermost index runs along a reduce iterator only (a pool's window
            # index, ``w * stride + rw``, also follows an output axis: it vectorizes)
            horizontal = any(
                r.source.name == main.name and r.region
                and any(_uses(r.region[-1].min, iv.var) for iv in red_ivs)
                and not any(_uses(r.region[-1].min, iv.var) for iv in b.iter_vars
                            if int(iv.iter_type) != _REDUCE_ITER)
                for r in b.reads)
    reduce_len = reduce_len or max(in_elems // max(out_elems, 1), 1)
    return OpInfo(role=role, passes=len(readers) if role == "reduction" else 1,
                  reduce_len=reduce_len, transcendental=math,
                  horizontal=role == "reduction" and horizontal,
                  nchw_conv=any(b.name_hint in _NCHW_CONV_BLOCKS for b in blocks),
                  rows=max(in_elems // reduce_len, 1) if role == "reduction" else 1,
                  in_bytes=in_elems * max(tvm.DataType(main.dtype).bits // 8, 1),
                  out_elems=out_elems, dtype_bytes=dbytes)


_CACHE: dict[int, tuple[OpGraph, tuple[OpInfo, ...]]] = {}


def graph_info(graph: OpGraph) -> tuple[OpInfo, ...]:
    """:func:`op_info` of every node, indexed by node id (cached per graph object)."""
    hit = _CACHE.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    infos = tuple(op_info(graph, n) for n in graph.nodes)
    if len(_CACHE) >= 16:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(graph)] = (graph, infos)
    return infos


def node_name(node: OpNode) -> str:
    """Stable name of a node: ``<op>#<id>`` (same model and shapes: same names)."""
    return f"{node.op}#{node.id}"


def tvm_bits(dtype: str) -> int:
    """Bits of one element of ``dtype`` (``float16`` -> 16)."""
    digits = "".join(c for c in dtype if c.isdigit())
    return int(digits) if digits else 32
