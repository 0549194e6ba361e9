"""Analytical cost of a candidate kernel (a group of operators) on a target.

Every number is hand-computable from the op graph and ``hw_targets/<name>.json``:

``dram_bytes``
    external inputs + escaping outputs + ``spill_bytes``. External inputs: each
    constant/model input a member reads, and each tensor produced outside the group
    (once, however many members read it). Escaping outputs: members read outside the
    group or returned by the model. Intermediates read only inside stay on chip.
    CPUs: a model whose weights and inputs fit the last-level cache together
    (:attr:`AnalyticalCostModel.weights_resident`) keeps them there between inferences;
    its kernels read them at the cache's rate (``memory_us``), not from DRAM.
    An activation (a tensor some node produces, not a model output) that fits the cache
    stays there between the kernel that writes it and the next that reads it, and is
    not DRAM traffic of either. CPUs: no larger than the cores' L2 together
    (``l2_bytes_per_unit * compute_units``; a parallel kernel leaves its slices in the
    L2 of the cores that wrote them). GPUs: no larger than the L2 (``llc_bytes``: 40 MB
    on A100, 50 MB on H100/H200, 8 MB per MI250X GCD).
    A gather (``take`` of an embedding table) reads the rows it gathers, not its table:
    ``min(table bytes, output bytes)`` of the table.
``staged_bytes`` (the working set one block or core task must hold)
    For a multi-pass reduction (``passes`` >= 2: softmax, layer norm) whose producer is
    in the group, one row of its input: ``reduce_len * dtype bytes``. Elementwise chains
    and GEMM epilogues stream through registers and stage nothing.
``onchip_bytes`` (the capacity it is checked against)
    GPUs: ``usable_shared_memory_per_block`` (static shared memory / LDS one TVM kernel
    may use: A100 48 KB, TVM's static limit; MI250X 64 KB), or for a schedule that
    allocates dynamic shared memory (dlight's WMMA GEMM) ``shared_memory_bytes_per_block``
    (the opt-in limit: 163 KB A100, 227 KB H100/H200). CPUs: ``l2_bytes_per_unit``
    (private L2 per core; ``llc_bytes / compute_units`` when there is none).
``spill_bytes``, ``recompute_flops``
    A multi-pass reduction whose row does not fit re-reads its input once per extra pass
    (``(passes-1) * input bytes``; nothing when that input stays in cache), or, when its producers are fused in, recomputes them
    once per extra pass (``(passes-1) *`` their FLOPs and their external input bytes).
    CPUs: a GEMM fused into a multi-pass reduction of its rows computes row by row, and
    re-reads a B operand (``K x N`` per batch) larger than one core's L2 through the
    last-level cache once per further row of its batch (``(rows - batches) *`` its bytes
    at the copy rate, added to ``memory_us``).
``compute_us``
    sum of FLOPs (CPUs: with what math calls cost beyond one FLOP each,
    :mod:`.op_info`'s ``transcendental``) / the peak of the unit that runs them: ``<dtype>_matrix`` for fp16,
    bf16 and int8 contractions where the target has one, else ``<dtype>_vector``
    (fp32_vector when the dtype has no entry). CPUs: a contraction's FLOPs are divided
    by its lane utilisation, ``min(1, innermost output extent / lanes)`` (lanes =
    ``vector_width_bits`` / dtype bits): its vectors run along the contiguous innermost
    dim, W of an NCHW conv (7 of 16 lanes at W=7), the channel block of an NCHW{c}c one
    (:mod:`~tvm_fusion.plan.layout` prices one layout against the other with it); and
    every CPU op's FLOPs by the share of peak a tuned kernel of its kind reaches
    (:mod:`.cpu_efficiency`: GEMM/conv with its register tile's accumulator use,
    depthwise conv, vector ops; the target file's ``cpu_efficiency``, else the
    default fitted on this project's tuned records).
``memory_us``
    ``dram_bytes / dram_bandwidth_gbs``. CPUs with a calibrated ``cache_bandwidth_gbs``:
    the kernel's whole footprint (its bytes in and out, cache-resident or not) moves at
    that rate up to ``llc_bytes``, and only the bytes beyond come from DRAM (at most
    ``dram_bytes``): the runner's repeats, and in a model the kernel just before, keep
    it hot in the last-level cache (a 25 MB concatenate ran at 131 GB/s, a 6 MB reshape
    at 178, an 84 MB concat at 40). A transpose of an L2-resident tensor is not free
    (25.6 us measured for one DNSMOS predicted at 0 before). A reduction-led kernel
    divides it by the ``reduction`` share (:mod:`.cpu_efficiency`).
``tiles``, ``parallel_fraction``
    CPUs: independent output tiles of the group: the minimum over its members of
    ceil(out elements / 256) for elementwise ops, ceil(out elements / 4096) (64x64
    tiles) for contractions, rows for reductions. ``parallel_fraction`` =
    min(1, tiles / compute_units). GPUs: thread blocks of dlight's schedule of the
    group, occupancy from registers and shared memory, wave quantization and latency
    hiding (:mod:`.gpu_terms`); ``parallel_fraction`` = roofline time / the time those
    terms give (so ``total_us`` below holds on both).
``launch_us``
    GPUs: ``launch_overhead_us`` (one kernel). CPUs: ``call_overhead_us`` per kernel
    where a calibrated description has it, else ``CPU_CALL_US`` (the Relax VM's call of
    a serial kernel, measured at 0.46 us on the development machine) plus ``launch_overhead_us`` per *parallel loop nest*: TVM runs each
    top-level nest of a kernel as its own parallel region (a fork-join of the thread
    pool, measured at 6.7 us on the same machine). A GEMM/conv with its
    elementwise epilogue and prologues is one nest; every other contraction, every pass
    of a reduction, the elementwise ops after a reduction, and each elementwise
    prologue of a reduction whose result also leaves the kernel are one more each. A nest
    with fewer than 2 tiles runs serially and pays no fork-join. So on a CPU fusing a
    conv with the reduction after it saves one call, not a fork-join. A kernel that is
    faster on one core runs there (the rules' serial variant): its FLOPs at one core's
    share of the peak, its bytes at the same rate when they fit that core's L2 (else at
    its share), and the call only.
``total_us``
    ``max(compute_us, memory_us) / parallel_fraction + launch_us``.

The rules per operator role live in ``RULES`` (a registry: one function per role adding
its terms); :class:`AnalyticalCostModel` sums them into a frozen :class:`GroupCost`. The
seam for a learned model: any object with ``group_cost(nodes) -> GroupCost`` can replace
it in the planner (e.g. one returning ``dataclasses.replace(analytical, total_us=
predicted, source="xgboost")``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from ..family import strategy
from ..graph import OpGraph
from .cpu_efficiency import contraction_efficiency, cpu_efficiency, is_depthwise
from .gpu_terms import gemm_tiles, occupancy
from .int8 import int8_peak, is_int8, reaches_int8_unit
from .gpu_resources import (GEMM_SCHEDULES, GPU_REGISTER_TOLERANCE, GpuResources,  # noqa: F401
                            _is_conv, gpu_resources)
from .op_info import OpInfo, graph_info, tvm_bits

ELEM_TILE = 256    # elements per independent tile of an elementwise op (one 256-thread block)
GEMM_TILE = 4096   # output elements per GEMM/conv tile (64 x 64)
CPU_CALL_US = 0.5  # the Relax VM's call of one serial kernel on a CPU (0.46 us measured)
_DTYPE_KEY = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
              "int8": "int8", "uint8": "int8"}


@dataclass(frozen=True, kw_only=True)
class GroupCost:
    """Predicted cost of one kernel; the formulas are in the module docstring."""

    nodes: tuple[int, ...]
    flops: float
    recompute_flops: float
    dram_bytes: int
    spill_bytes: int
    staged_bytes: int
    onchip_bytes: int
    tiles: int
    parallel_fraction: float
    compute_us: float
    memory_us: float
    launch_us: float
    total_us: float
    source: str = "analytical"
    # GPUs (see gpu_terms): resident blocks per SM / CU, their share of its threads,
    # waves of blocks, and how much of the DRAM latency the resident warps hide
    blocks_per_unit: int = 0
    occupancy: float = 1.0
    waves: int = 1
    latency_hiding: float = 1.0
    resources: GpuResources | None = None  # the GPU kernel's, estimated or compiled

    @property
    def fits(self) -> bool:
        """Whether the staged working set fits the on-chip capacity."""
        return self.staged_bytes <= self.onchip_bytes

    @property
    def bound(self) -> str:
        """``compute`` or ``memory``: the larger roofline term."""
        return "compute" if self.compute_us > self.memory_us else "memory"

    @property
    def roofline_us(self) -> float:
        """``max(compute_us, memory_us)``: the time at full parallelism, no launch."""
        return max(self.compute_us, self.memory_us)


@dataclass
class _Terms:
    """What the role rules add up for one group."""

    compute_s: float = 0.0
    flops: float = 0.0
    recompute_flops: float = 0.0
    spill_bytes: int = 0
    staged_bytes: int = 0
    reread_bytes: int = 0  # CPUs: moved again through the last-level cache
    tiles: int = 1 << 62


def onchip_capacity(hw, *, dynamic: bool = False) -> int:
    """Bytes one block (GPU) or one core's task (CPU) may keep on chip (``dynamic``: a
    GPU schedule that allocates dynamic shared memory, up to the opt-in limit)."""
    if strategy(hw).core_caches:
        return hw.l2_bytes_per_unit or hw.llc_bytes // max(hw.compute_units, 1)
    return hw.shared_memory_bytes_per_block if dynamic else hw.usable_shared_memory_per_block


def peak_flops(hw, dtype: str, *, matrix: bool) -> float:
    """FLOP/s of the unit that runs an op of ``dtype`` (see the module docstring)."""
    key = _DTYPE_KEY.get(dtype, "fp32")
    if key == "int8" and matrix:  # a contraction: the unit TVM reaches (plan/int8.py)
        return int8_peak(hw)
    if matrix and key != "fp32" and f"{key}_matrix" in hw.peak_flops:
        return hw.peak_flops[f"{key}_matrix"]
    return hw.peak_flops.get(f"{key}_vector", hw.peak_fp32_flops)


RULES: dict[str, Callable[["AnalyticalCostModel", int, frozenset, _Terms], None]] = {}


def cost_rule(role: str):
    """Register the cost rule of an operator role (``elementwise``, ``reduction``...)."""
    def register(fn):
        RULES[role] = fn
        return fn
    return register


def _add_op(model, nid, terms, *, matrix: bool, tiles: int,
            efficiency: float | None = None) -> None:
    """The terms every role shares: FLOPs at the unit's peak (times ``efficiency``, else
    the op's own), and the op's tiles."""
    node = model.graph.nodes[nid]
    terms.flops += node.flops
    work = node.flops + model.transcendental(nid)
    terms.compute_s += work / peak_flops(model.hw, node.dtype, matrix=matrix) \
        / (efficiency or model.efficiency(nid))
    terms.tiles = min(terms.tiles, tiles)


@cost_rule("elementwise")
@cost_rule("opaque")
def _elementwise(model, nid, members, terms):
    """FLOPs on the vector units; one tile per 256 output elements. The epilogue of a
    fused contraction runs on its register tile, at the contraction's share: its
    operands are already in vector registers (a GELU's erf polynomial after a pointwise
    conv ran at 0.9 of peak, where the vector share of a standalone op priced it 4x
    over: PP-OCRv6's GELU convs, 2.3x over in all). Measured on float contractions
    only: an int8 conv's requantizing epilogue keeps the vector share."""
    info = model.infos[nid]
    producers = [a for a in model.ancestors_in(nid, members)
                 if model.infos[a].role == "contraction"
                 and not is_int8(model.operand_dtype(a))] if len(members) > 1 else []
    _add_op(model, nid, terms, matrix=False, tiles=math.ceil(info.out_elems / ELEM_TILE),
            efficiency=max(model.efficiency(a) for a in producers) if producers else None)


@cost_rule("contraction")
def _contraction(model, nid, members, terms):
    """FLOPs on the matrix units where the operands' dtype has one (fp16 operands with an
    fp32 accumulator, as mixed precision emits, run on the fp16 tensor-core peak); one
    tile per 64x64 outputs."""
    info = model.infos[nid]
    node = model.graph.nodes[nid]
    dtype = model.operand_dtype(nid)
    if is_int8(dtype) and not reaches_int8_unit(model.hw, node.op):
        dtype = "int32"  # integer loops on the vector units (plan/int8.py)
    terms.flops += node.flops
    terms.compute_s += node.flops / peak_flops(model.hw, dtype, matrix=True) \
        / lane_utilisation(model.hw, node) / model.efficiency(nid)
    terms.tiles = min(terms.tiles, math.ceil(info.out_elems / GEMM_TILE))


def lane_utilisation(hw, node) -> float:
    """CPUs: the share of a vector's lanes a contraction's innermost output dim fills
    (``min(1, extent / lanes)``); 1 on GPUs and for unknown extents.

    Unit dims do not count: an output whose innermost dims are 1 (an SE block's 1 x 1
    conv on a pooled [1, C, 1, 1], a 1-D conv down to one position) has no loop there,
    and its schedule vectorizes the next dim out. 17 of the corpus's 22 contractions
    with a short innermost dim were predicted 1.8-11x over, all of the 1 x 1 ones.
    """
    dims = [int(d) for d in node.shape] if node.shape else []
    if not strategy(hw).vector_lanes or not dims or min(dims) <= 0:
        return 1.0
    lanes = max(int(hw.vector_width_bits) // tvm_bits(node.dtype), 1)
    extent = next((d for d in reversed(dims) if d > 1), 1)
    return extent / (math.ceil(extent / lanes) * lanes)


@cost_rule("reduction")
def _reduction(model, nid, members, terms):
    """One tile per row; a multi-pass reduction stages, re-reads or recomputes its row."""
    info = model.infos[nid]
    _add_op(model, nid, terms, matrix=False, tiles=info.rows)
    if info.passes < 2:
        # a window that overlaps its neighbours (3x3 stride-2 pooling reads each input
        # 9/4 times) recomputes its fused producers once per extra read
        reads = info.out_elems * info.reduce_len / max(info.in_bytes // info.dtype_bytes, 1)
        for a in model.ancestors_in(nid, members) if reads > 1 else ():
            anode = model.graph.nodes[a]
            terms.recompute_flops += (reads - 1) * anode.flops
            terms.compute_s += (reads - 1) * anode.flops / peak_flops(
                model.hw, anode.dtype, matrix=False) / model.efficiency(a)
        return
    row = info.reduce_len * info.dtype_bytes
    fused_in = model.ancestors_in(nid, members)
    if fused_in:
        terms.staged_bytes = max(terms.staged_bytes, row)
    if model.family.core_caches:
        # a GEMM fused into a row-wise multi-pass reduction (a softmax over its outputs)
        # computes one whole row at a time, so no tile reuses its weight across rows:
        # a weight beyond one core's L2 streams through the LLC once per row
        # (PP-OCRv6's 9 MB classifier + softmax: 2.7 ms measured, 40 rows x 9 MB)
        for a in fused_in:
            anode, ainfo = model.graph.nodes[a], model.infos[a]
            if ainfo.role != "contraction" or not anode.op.startswith(("matmul", "dense")) \
                    or len(anode.shape) < 2:
                continue
            # the B operand of each batch (an attention head's K): K x N elements
            batch = max(ainfo.out_elems // max(int(anode.shape[-1]) * int(anode.shape[-2]), 1), 1)
            weight = ainfo.reduce_len * int(anode.shape[-1]) * ainfo.dtype_bytes
            if weight > model.core_l2_bytes():
                terms.reread_bytes += max(info.rows - batch, 0) * weight
    if row <= onchip_capacity(model.hw):
        return
    extra = info.passes - 1
    if not fused_in:  # re-read the input from DRAM once per extra pass, unless cached
        node = model.graph.nodes[nid]
        if not (node.inputs and all(model.cache_resident(p) for p in node.inputs)):
            terms.spill_bytes += extra * info.in_bytes
        return
    for a in fused_in:  # recompute the fused producers once per extra pass
        anode = model.graph.nodes[a]
        terms.recompute_flops += extra * anode.flops
        terms.compute_s += extra * anode.flops / peak_flops(
            model.hw, anode.dtype, matrix=model.infos[a].role == "contraction") \
            / model.efficiency(a)
        terms.spill_bytes += extra * model.external_in(a, members)


OP_CLASSES = ("gemm", "conv", "depthwise", "reduction", "elementwise/memory",
              "gather/scatter")
_GATHER_OPS = ("take", "gather", "scatter", "index", "one_hot", "where_index")


def op_class(graph: OpGraph, infos, nodes: Iterable[int]) -> str:
    """The class of a kernel by its main operator (one of :data:`OP_CLASSES`): the
    contraction with the most FLOPs (``depthwise`` conv, ``conv``, else ``gemm``), else
    ``reduction`` if it reduces, ``gather/scatter`` if it indexes by data, else
    ``elementwise/memory``. The model's measured error is per class (the family's
    ``class_errors``, ``benchmarks/planner_accuracy.py``)."""
    nodes = list(nodes)
    contractions = [n for n in nodes if infos[n].role == "contraction"]
    if contractions:
        main = max(contractions, key=lambda n: graph.nodes[n].flops)
        node, info = graph.nodes[main], infos[main]
        if is_depthwise(graph, node, info):
            return "depthwise"
        return "conv" if node.op.startswith("conv") else "gemm"
    if any(infos[n].role == "reduction" for n in nodes):
        return "reduction"
    if any(graph.nodes[n].op.startswith(_GATHER_OPS) for n in nodes):
        return "gather/scatter"
    return "elementwise/memory"


class AnalyticalCostModel:
    """Cost of any group of ``graph``'s nodes on ``hw`` (see the module docstring)."""

    def __init__(self, graph: OpGraph, hw, infos: tuple[OpInfo, ...] | None = None, *,
                 compiled: Mapping[frozenset, GpuResources] | None = None):
        self.graph, self.hw = graph, hw
        self.family = strategy(hw) if hw is not None else None  # what hw's family decides
        # a GPU group's kernel as a compiler allocated it: wins over gpu_resources'
        # estimate (tvm_fusion.gpu.resources builds them)
        self.compiled = dict(compiled or {})
        self.infos = infos if infos is not None else graph_info(graph)
        self.users = graph.consumers()
        self.outputs = set(graph.outputs)
        # per result of a multi-output node (a Split's pieces go to different readers)
        self.item_users = graph.result_readers()
        self.output_items = set(graph.output_items)
        self._cache: dict[frozenset, GroupCost] = {}
        self._eff: dict[int, float] = {}
        self._weights_resident: bool | None = None
        self.cpu_efficiency = (cpu_efficiency(hw) if hw is not None
                               and self.family.fitted_efficiency else None)

    def efficiency(self, nid: int) -> float:
        """Share of its unit's peak ``nid``'s FLOPs run at (:mod:`.cpu_efficiency`;
        1 on GPUs, whose terms are in :mod:`.gpu_terms`)."""
        eff = self.cpu_efficiency
        if eff is None:
            return 1.0
        if nid not in self._eff:
            info, node = self.infos[nid], self.graph.nodes[nid]
            if info.role != "contraction":
                self._eff[nid] = eff.vector
            else:
                lanes = max(int(self.hw.vector_width_bits) // tvm_bits(node.dtype), 1)
                depthwise = is_depthwise(self.graph, node, info)
                self._eff[nid] = contraction_efficiency(
                    self.hw, eff, node, info, lanes=lanes, depthwise=depthwise,
                    nchw=not depthwise and info.nchw_conv)
        return self._eff[nid]

    def transcendental(self, nid: int) -> float:
        """CPUs: the FLOPs ``nid``'s math calls cost beyond one each (:mod:`.op_info`);
        0 on GPUs, whose special-function units :mod:`.gpu_terms` leaves out."""
        return self.infos[nid].transcendental if self.hw is not None \
            and self.family.prices_transcendentals else 0.0

    def const_bytes(self, nid: int) -> int:
        """Bytes ``nid`` reads that no node produces (weights, constants, model inputs)."""
        node = self.graph.nodes[nid]
        made = sum(self.graph.result_bytes(item) for item in self._reads(node))
        const = max(node.bytes_read - made, 0)
        table = self._gather_table_bytes(node) if const else 0
        if table and table <= const:  # a gather reads the rows it gathers
            return const - table + min(table, node.bytes_written)
        return const

    def _gather_table_bytes(self, node) -> int:
        """Bytes of the table a ``take`` gathers from (its first buffer), else 0."""
        if not node.op.startswith("take"):
            return 0
        try:
            buf = self.graph.mod[node.op].params[0]  # TIR params are buffers in 0.27
            elems = math.prod(int(d) for d in buf.shape)
        except (KeyError, ValueError, AttributeError, IndexError, TypeError):
            return 0
        return elems * max(tvm_bits(str(buf.dtype)) // 8, 1)

    def _reads(self, node):
        """(producer, result index) pairs ``node`` reads (every result of a producer
        for a graph built by hand without ``reads``)."""
        if node.reads or not node.inputs:
            return node.reads
        return tuple((p, k) for p in node.inputs
                     for k in range(max(len(self.graph.nodes[p].results), 1)))

    def result_escapes(self, item, members) -> bool:
        """Whether result ``item = (node, index)`` is needed outside ``members``."""
        return (item in self.output_items
                or any(u not in members for u in self.item_users.get(item, ())))

    def operand_dtype(self, nid: int) -> str:
        """dtype of ``nid``'s first input buffer (a contraction's operands), else its output's."""
        node = self.graph.nodes[nid]
        try:
            params = self.graph.mod[node.op].params
        except (KeyError, ValueError, AttributeError):  # not a PrimFunc of the module
            return node.dtype
        return str(params[0].dtype) if len(params) > 1 else node.dtype

    def gpu_resources(self, nodes: Iterable[int]) -> "GpuResources":
        """Predicted registers, shared memory and threads of the group's GPU kernel(s).

        See :func:`gpu_resources` (the schedule it assumes and how far to trust it). A
        group in ``compiled`` gets the compiler's numbers and the rule that scheduled it,
        with the estimate's kept as ``estimated_registers`` / ``estimated_schedule``.
        """
        members = frozenset(nodes)
        est = gpu_resources(self, members)
        built = self.compiled.get(members)
        if built is None:
            return est
        schedule = est.schedule if built.schedule == "compiled" else built.schedule
        return dataclasses.replace(built, schedule=schedule,
                                   estimated_registers=est.registers_per_thread,
                                   estimated_schedule=est.schedule)

    def external_in(self, nid: int, members) -> int:
        """Bytes ``nid`` reads from outside ``members``."""
        node = self.graph.nodes[nid]
        return self.const_bytes(nid) + sum(self.graph.result_bytes(i)
                                           for i in self._reads(node) if i[0] not in members)

    def escapes(self, nid: int, members) -> bool:
        """Whether ``nid``'s result is needed outside ``members``."""
        return nid in self.outputs or any(u not in members for u in self.users[nid])

    def ancestors_in(self, nid: int, members) -> list[int]:
        """Members from which ``nid`` is reached through members only."""
        seen, stack = set(), [p for p in self.graph.nodes[nid].inputs if p in members]
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack += [q for q in self.graph.nodes[p].inputs if q in members]
        return sorted(seen)

    @property
    def weights_resident(self) -> bool:
        """CPUs: whether the model's weights and inputs (every byte no node produces)
        fit the last-level cache together, so that they stay there from one inference
        to the next and no kernel reads them from DRAM (chars2vec's LSTM matmuls, which
        read their 1 MB of weights every step, were priced 4-6x over from DRAM)."""
        if self._weights_resident is None:
            hw = self.hw
            self._weights_resident = hw is not None and self.family.core_caches and \
                self._model_const_bytes() <= hw.llc_bytes
        return self._weights_resident

    def _model_const_bytes(self) -> int:
        """Bytes of the model's distinct constants and inputs (an unrolled LSTM's steps
        share one weight: 4.6 MB in chars2vec, 52 MB counted per reader)."""
        import tvm
        from tvm import relax

        try:
            main = self.graph.mod["main"]
        except (KeyError, ValueError, AttributeError):  # a graph built without one
            return sum(self.const_bytes(n.id) for n in self.graph.nodes)
        consts = {}

        def visit(e):
            if isinstance(e, tvm.ir.Constant) and isinstance(e.value, tvm.runtime.Tensor):
                consts[e] = e.value

        relax.analysis.post_order_visit(main.body, visit)
        total = sum(math.prod(int(d) for d in v.shape) * max(tvm_bits(str(v.dtype)) // 8, 1)
                    for v in consts.values())
        for p in main.params:
            ty = getattr(p, "ty", None)  # TVM 0.27's name for struct_info
            dims = getattr(getattr(ty, "shape", None), "values", None)
            if dims is not None and all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                total += math.prod(int(d) for d in dims) * max(tvm_bits(str(ty.dtype)) // 8, 1)
        return total

    def cache_resident(self, nid: int) -> bool:
        """Whether ``nid``'s result stays in cache between kernels (see above)."""
        hw = self.hw
        if hw is None or nid in self.outputs:
            return False
        if not self.family.core_caches:
            return self.graph.nodes[nid].bytes_written <= hw.llc_bytes
        l2 = hw.l2_bytes_per_unit * max(hw.compute_units, 1) or hw.llc_bytes
        return self.graph.nodes[nid].bytes_written <= l2

    def traffic(self, members, private=frozenset(), *, cached: bool = True) -> int:
        """External input bytes (each outside producer once) plus escaping outputs.

        A ``private`` member's result never leaves (its other readers recompute it), but
        what it reads does: the copies elsewhere read it from DRAM. Cache-resident
        activations (:meth:`cache_resident`) are neither read nor written from DRAM
        (``cached=False``: counted as if they were, the kernel's bytes in and out).
        """
        graph = self.graph
        resident = self.cache_resident if cached else (lambda nid: False)
        outside = {i for n in members for i in self._reads(graph.nodes[n])
                   if i[0] not in members and not resident(i[0])}
        read_by_copies = {i for n in private for i in self._reads(graph.nodes[n])}
        written = 0
        for n in members:
            if n in private or resident(n):
                continue
            if len(graph.nodes[n].results) <= 1:
                if n in {i[0] for i in read_by_copies} or self.escapes(n, members):
                    written += graph.nodes[n].bytes_written
                continue
            # a multi-output node writes only the results needed elsewhere
            written += sum(graph.result_bytes((n, k)) for k in range(len(graph.nodes[n].results))
                           if (n, k) in read_by_copies or self.result_escapes((n, k), members))
        consts = 0 if cached and self.weights_resident else \
            sum(self.const_bytes(n) for n in members)
        return consts + sum(graph.result_bytes(i) for i in outside) + written

    def launch_us(self, members) -> float:
        """Launch cost of one kernel computing ``members`` (``launch_us`` above)."""
        hw = self.hw
        if not self.family.fork_join:
            return hw.launch_overhead_us
        nests = []  # tiles of each top-level loop nest
        for n in members:
            info = self.infos[n]
            if info.role == "contraction":
                nests.append(math.ceil(info.out_elems / GEMM_TILE))
            elif info.role == "reduction":
                nests += [info.rows] * max(info.passes, 1)
                if any(self.infos[u].role in ("elementwise", "opaque")
                       for u in self.users[n] if u in members):
                    nests.append(math.ceil(info.out_elems / ELEM_TILE))
                # a prologue whose result is also needed elsewhere is written by its
                # own nest, not inlined into the reduction's
                nests += [math.ceil(self.infos[a].out_elems / ELEM_TILE)
                          for a in self.ancestors_in(n, members)
                          if self.infos[a].role == "elementwise" and self.escapes(a, members)]
        if not nests:  # elementwise only: inlined into one nest
            nests.append(min(math.ceil(self.infos[n].out_elems / ELEM_TILE) for n in members))
        return self.call_us() + hw.launch_overhead_us * sum(1 for tiles in nests if tiles >= 2)

    def footprint(self, members, private=frozenset(), spill_bytes: int = 0) -> int:
        """Bytes a kernel moves, cache-resident or not (:meth:`traffic` uncached)."""
        return self.traffic(frozenset(members), frozenset(private), cached=False) + spill_bytes

    def core_l2_bytes(self) -> int:
        """CPUs: one core's L2, which one core alone moves its bytes through."""
        return self.hw.l2_bytes_per_unit or 0

    def memory_kind(self, members) -> str | None:
        """CPUs: which share of the copy rate a group's bytes move at
        (:data:`~.cpu_efficiency.MEMORY_KINDS`), None for the copy rate itself.

        A group with a member that reads across the innermost axis (a transpose, a
        layout change) is ``strided``, a GEMM or conv with such an epilogue too: its
        stores scatter out of the register tile, and such kernels ran 1.5-3.7x over
        their contraction's time (12 of 13 in the corpus, benchmarks/RESULTS.md run 23);
        at this share its FLOPs run as well. Else a group led by a reduction (no
        contraction in it) takes its largest reduction's kind: ``reduction`` along the
        innermost axis, else ``reduction_vector``. The rest stream at the copy rate.
        """
        infos = [self.infos[n] for n in members]
        # measured on float GEMMs and convs only: an int8 conv's requantizing epilogue
        # writes bytes, not floats, from its VNNI tile
        if any(i.strided for i in infos) and not any(
                i.role == "contraction" and is_int8(self.operand_dtype(n))
                for n, i in zip(members, infos)):
            return "strided"
        if any(i.role == "contraction" for i in infos):
            return None
        if any(i.short_rows for i in infos):  # a GEMM's tile writes them at no cost
            return "strided"
        reductions = [i for i in infos if i.role == "reduction"]
        if not reductions:
            return None
        return "reduction" if max(reductions, key=lambda i: i.in_bytes).horizontal \
            else "reduction_vector"

    def call_us(self) -> float:
        """CPUs: the VM's call of one serial kernel (``call_overhead_us``, else
        ``CPU_CALL_US``)."""
        hw = self.hw
        return CPU_CALL_US if hw.call_overhead_us is None else hw.call_overhead_us

    def _gpu_tiles(self, members, res, tiles: int) -> int:
        """Thread blocks of dlight's schedule of the group (:mod:`.gpu_terms`)."""
        contractions = [n for n in members if self.infos[n].role == "contraction"]
        if res.schedule in GEMM_SCHEDULES and len(contractions) == 1:
            nid = contractions[0]
            node = self.graph.nodes[nid]
            shape = [max(int(d), 1) for d in node.shape] or [1]
            if _is_conv(node):
                cols = shape[1]
                return gemm_tiles(1, self.infos[nid].out_elems // cols, cols, res.schedule)
            rows = shape[-2] if len(shape) >= 2 else 1
            return gemm_tiles(math.prod(shape[:-2]), rows, shape[-1], res.schedule)
        if res.schedule == "elementwise" or res.schedule in GEMM_SCHEDULES:
            return max(math.ceil(self.infos[n].out_elems / res.threads_per_block)
                       for n in members)
        if res.schedule == "reduction":  # one block per row; prologues are inlined
            return min(self.infos[n].rows if self.infos[n].role == "reduction"
                       else self.infos[n].out_elems for n in members
                       if self.infos[n].role in ("reduction", "contraction"))
        return tiles

    def group_cost(self, nodes: Iterable[int], *, private: Iterable[int] = ()) -> GroupCost:
        """The :class:`GroupCost` of one kernel computing ``nodes``.

        ``private``: members duplicated into other kernels too (:mod:`.duplicate`);
        their results are not written to DRAM by this kernel.
        """
        members = frozenset(nodes)
        private = frozenset(private) & members
        key = (members, private) if private else members
        if key in self._cache:
            return self._cache[key]
        terms = _Terms()
        for nid in sorted(members):
            RULES[self.infos[nid].role](self, nid, members, terms)
        hw = self.hw
        dram = self.traffic(members, private) + terms.spill_bytes
        compute_us = terms.compute_s * 1e6
        memory_us = dram / (hw.dram_bandwidth_gbs * 1e3)
        footprint = self.footprint(members, private, terms.spill_bytes) \
            if self.family.core_caches else 0
        if self.family.core_caches and hw.cache_bandwidth_gbs:
            # what stays in cache still moves through it, at the calibrated copy rate;
            # so does a kernel's whole footprint up to the last-level cache, which the
            # runner's repeats and the producer just before keep hot there: only the
            # bytes beyond it come from DRAM (a 25 MB concatenate: 131 GB/s measured)
            from_dram = min(dram, max(footprint - hw.llc_bytes, 0)) if hw.llc_bytes \
                else dram
            memory_us = (from_dram / (hw.dram_bandwidth_gbs * 1e3)
                         + max(footprint - from_dram, 0) / (hw.cache_bandwidth_gbs * 1e3))
        launch_us = self.launch_us(members)
        gpu, tiles, dynamic = {}, terms.tiles, False
        if self.family.core_caches and terms.reread_bytes:
            memory_us += terms.reread_bytes / (
                (hw.cache_bandwidth_gbs or hw.dram_bandwidth_gbs) * 1e3)
        if self.family.fork_join:
            if self.cpu_efficiency is not None:
                kind = self.memory_kind(members)
                share = self.cpu_efficiency.memory_share(kind)
                memory_us /= share
                if kind == "strided":
                    compute_us /= share
            units = max(hw.compute_units, 1)
            frac = min(1.0, terms.tiles / units)
            # one core alone: its share of the FLOP rate, and of the bandwidth unless
            # the kernel's bytes fit its own L2
            in_l2 = footprint <= self.core_l2_bytes()
            serial = max(compute_us * units, memory_us if in_l2 else memory_us * units)
            if serial + self.call_us() < max(compute_us, memory_us) / frac + launch_us:
                # a kernel of a few microseconds runs faster on one core than it forks
                # and joins the pool (the rules' serial variant, schedules/cpu_rules.py)
                frac = max(compute_us, memory_us) / serial if serial > 0 else 1.0
                launch_us = self.call_us()
        else:
            res = self.gpu_resources(members)
            dynamic = res.schedule == "gemm-tensorcore"
            tiles = self._gpu_tiles(members, res, terms.tiles)
            # every kernel the group becomes is launched (compiled: as the compiler built
            # it; estimated: a split's pieces, gpu_resources)
            launch_us = hw.launch_overhead_us * max(res.kernels, 1)
            if res.spill_bytes:  # spilled registers go to local memory and come back
                dram += 2 * res.spill_bytes * res.threads_per_block * tiles
                memory_us = dram / (hw.dram_bandwidth_gbs * 1e3)
            occ = occupancy(hw, res, tiles)
            busy = max(compute_us / occ.quantization, memory_us / occ.memory_fraction)
            frac = max(compute_us, memory_us) / busy if busy > 0 else 1.0
            gpu = dict(blocks_per_unit=occ.blocks_per_unit, occupancy=occ.occupancy,
                       waves=occ.waves, latency_hiding=occ.latency_hiding,
                       resources=res)
        total_us = max(compute_us, memory_us) / frac + launch_us
        cost = GroupCost(
            nodes=tuple(sorted(members)), flops=terms.flops + terms.recompute_flops,
            recompute_flops=terms.recompute_flops, dram_bytes=dram,
            spill_bytes=terms.spill_bytes, staged_bytes=terms.staged_bytes,
            onchip_bytes=onchip_capacity(hw, dynamic=dynamic), tiles=tiles,
            parallel_fraction=frac, compute_us=compute_us, memory_us=memory_us,
            launch_us=launch_us, total_us=total_us, **gpu)
        self._cache[key] = cost
        return cost


def group_traffic(graph: OpGraph, nodes: Iterable[int]) -> tuple[float, int]:
    """FLOPs and DRAM bytes of a group: external reads once, outputs leaving it once."""
    model = AnalyticalCostModel(graph, None, infos=(None,) * len(graph.nodes))
    members = frozenset(nodes)
    return sum(graph.nodes[n].flops for n in members), model.traffic(members)


def estimate_us(graph: OpGraph, nodes: Iterable[int], hw, *, model=None) -> float:
    """Predicted time of one kernel computing ``nodes`` on ``hw``, in microseconds.

    Parameters
    ----------
    graph : OpGraph
    nodes : iterable of int
        Node ids of the group.
    hw : HardwareTarget
    model : AnalyticalCostModel, optional
        Reuse one model (and its per-node facts) across calls.
    """
    model = model or AnalyticalCostModel(graph, hw)
    return model.group_cost(nodes).total_us


def decision_terms(fused: GroupCost, parts: list[GroupCost]) -> dict[str, float]:
    """Predicted saving of fusing ``parts`` into ``fused``, per hardware term, in us.

    ``launch overhead``: launches saved. ``compute``: FLOP time saved at full
    parallelism (negative when fusing recomputes). ``DRAM traffic``: the rest of the
    roofline saving, sum(max(compute_us, memory_us)) of the parts minus the fused one's,
    less the compute term. ``parallelism``: what dividing by the parallel fractions adds
    on top. ``learned``, where a learned model priced a kernel: its times' departure
    from the analytical ones. The terms add up to the total saving; a negative term is a
    cost of fusing.
    """
    roof = sum(p.roofline_us for p in parts) - fused.roofline_us
    comp = sum(p.compute_us for p in parts) - fused.compute_us
    scaled = sum(p.roofline_us / p.parallel_fraction for p in parts) - (
        fused.roofline_us / fused.parallel_fraction)
    terms = {
        "launch overhead": sum(p.launch_us for p in parts) - fused.launch_us,
        "DRAM traffic": roof - comp,
        "compute": comp,
        "parallelism": scaled - roof,
    }
    if any(c.source.startswith("learned") for c in (fused, *parts)):
        saving = sum(p.total_us for p in parts) - fused.total_us
        terms["learned"] = saving - sum(terms.values())
    return terms
