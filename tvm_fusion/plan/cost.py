"""Analytical cost of a candidate kernel (a group of operators) on a target.

Every number is hand-computable from the op graph and ``hw_targets/<name>.json``:

``dram_bytes``
    external inputs + escaping outputs + ``spill_bytes``. External inputs: each
    constant/model input a member reads, and each tensor produced outside the group
    (once, however many members read it). Escaping outputs: members read outside the
    group or returned by the model. Intermediates read only inside stay on chip.
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
``compute_us``
    sum of FLOPs / the peak of the unit that runs them: ``<dtype>_matrix`` for fp16,
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
    ``dram_bytes / dram_bandwidth_gbs``; CPUs with a calibrated ``cache_bandwidth_gbs``
    add the bytes of cache-resident tensors the kernel reads and writes at that rate (a
    transpose of an L2-resident tensor is not free: 25.6 us measured for one DNSMOS
    predicted at 0 before).
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
    conv with the reduction after it saves one call, not a fork-join.
``total_us``
    ``max(compute_us, memory_us) / parallel_fraction + launch_us``.

The rules per operator role live in ``RULES`` (a registry: one function per role adding
its terms); :class:`AnalyticalCostModel` sums them into a frozen :class:`GroupCost`. The
seam for a learned model: any object with ``group_cost(nodes) -> GroupCost`` can replace
it in the planner (e.g. one returning ``dataclasses.replace(analytical, total_us=
predicted, source="xgboost")``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from ..graph import OpGraph
from .cpu_efficiency import contraction_efficiency, cpu_efficiency, is_depthwise
from .gpu_terms import gemm_tiles, occupancy
from .int8 import int8_peak, is_int8, reaches_int8_unit
from .op_info import OpInfo, graph_info

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
    tiles: int = 1 << 62


def onchip_capacity(hw, *, dynamic: bool = False) -> int:
    """Bytes one block (GPU) or one core's task (CPU) may keep on chip (``dynamic``: a
    GPU schedule that allocates dynamic shared memory, up to the opt-in limit)."""
    if hw.family == "cpu":
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


def _add_op(model, nid, terms, *, matrix: bool, tiles: int) -> None:
    """The terms every role shares: FLOPs at the unit's peak, and the op's tiles."""
    node = model.graph.nodes[nid]
    terms.flops += node.flops
    terms.compute_s += node.flops / peak_flops(model.hw, node.dtype, matrix=matrix) \
        / model.efficiency(nid)
    terms.tiles = min(terms.tiles, tiles)


@cost_rule("elementwise")
@cost_rule("opaque")
def _elementwise(model, nid, members, terms):
    """FLOPs on the vector units; one tile per 256 output elements."""
    info = model.infos[nid]
    _add_op(model, nid, terms, matrix=False, tiles=math.ceil(info.out_elems / ELEM_TILE))


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
    (``min(1, extent / lanes)``); 1 on GPUs and for unknown extents."""
    if hw.family != "cpu" or not node.shape or int(node.shape[-1]) <= 0:
        return 1.0
    lanes = max(int(hw.vector_width_bits) // tvm_bits(node.dtype), 1)
    return min(1.0, int(node.shape[-1]) / lanes)


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


class AnalyticalCostModel:
    """Cost of any group of ``graph``'s nodes on ``hw`` (see the module docstring)."""

    def __init__(self, graph: OpGraph, hw, infos: tuple[OpInfo, ...] | None = None):
        self.graph, self.hw = graph, hw
        self.infos = infos if infos is not None else graph_info(graph)
        self.users = graph.consumers()
        self.outputs = set(graph.outputs)
        # per result of a multi-output node (a Split's pieces go to different readers)
        self.item_users = graph.result_readers()
        self.output_items = set(graph.output_items)
        self._cache: dict[frozenset, GroupCost] = {}
        self._eff: dict[int, float] = {}
        self.cpu_efficiency = (cpu_efficiency(hw) if hw is not None and hw.family == "cpu"
                               else None)

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
                self._eff[nid] = contraction_efficiency(
                    self.hw, eff, node, info, lanes=lanes,
                    depthwise=is_depthwise(self.graph, node, info))
        return self._eff[nid]

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

        See :func:`gpu_resources` (the schedule it assumes and how far to trust it).
        """
        return gpu_resources(self, nodes)

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

    def cache_resident(self, nid: int) -> bool:
        """Whether ``nid``'s result stays in cache between kernels (see above)."""
        hw = self.hw
        if hw is None or nid in self.outputs:
            return False
        if hw.family != "cpu":
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
        return (sum(self.const_bytes(n) for n in members)
                + sum(graph.result_bytes(i) for i in outside) + written)

    def launch_us(self, members) -> float:
        """Launch cost of one kernel computing ``members`` (``launch_us`` above)."""
        hw = self.hw
        if hw.family != "cpu":
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
        call = CPU_CALL_US if hw.call_overhead_us is None else hw.call_overhead_us
        return call + hw.launch_overhead_us * sum(1 for tiles in nests if tiles >= 2)

    def _gpu_tiles(self, members, res, tiles: int) -> int:
        """Thread blocks of dlight's schedule of the group (:mod:`.gpu_terms`)."""
        if res.schedule in ("gemm", "gemm-tensorcore"):
            (nid,) = [n for n in members if self.infos[n].role == "contraction"]
            node = self.graph.nodes[nid]
            shape = [max(int(d), 1) for d in node.shape] or [1]
            if _is_conv(node):
                cols = shape[1]
                return gemm_tiles(1, self.infos[nid].out_elems // cols, cols, res.schedule)
            rows = shape[-2] if len(shape) >= 2 else 1
            return gemm_tiles(math.prod(shape[:-2]), rows, shape[-1], res.schedule)
        if res.schedule == "elementwise":
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
        if hw.family == "cpu" and hw.cache_bandwidth_gbs:
            # what stays in cache still moves through it, at the calibrated copy rate
            in_cache = self.traffic(members, private, cached=False) + terms.spill_bytes - dram
            memory_us += max(in_cache, 0) / (hw.cache_bandwidth_gbs * 1e3)
        launch_us = self.launch_us(members)
        gpu, tiles, dynamic = {}, terms.tiles, False
        if hw.family == "cpu":
            frac = min(1.0, terms.tiles / max(hw.compute_units, 1))
        else:
            res = gpu_resources(self, members)
            dynamic = res.schedule == "gemm-tensorcore"
            tiles = self._gpu_tiles(members, res, terms.tiles)
            occ = occupancy(hw, res, tiles)
            busy = max(compute_us / occ.quantization, memory_us / occ.memory_fraction)
            frac = max(compute_us, memory_us) / busy if busy > 0 else 1.0
            gpu = dict(blocks_per_unit=occ.blocks_per_unit, occupancy=occ.occupancy,
                       waves=occ.waves, latency_hiding=occ.latency_hiding)
        cost = GroupCost(
            nodes=tuple(sorted(members)), flops=terms.flops + terms.recompute_flops,
            recompute_flops=terms.recompute_flops, dram_bytes=dram,
            spill_bytes=terms.spill_bytes, staged_bytes=terms.staged_bytes,
            onchip_bytes=onchip_capacity(hw, dynamic=dynamic), tiles=tiles,
            parallel_fraction=frac, compute_us=compute_us, memory_us=memory_us,
            launch_us=launch_us, total_us=max(compute_us, memory_us) / frac + launch_us,
            **gpu)
        self._cache[key] = cost
        return cost


# ---- GPU kernel resources ---------------------------------------------------------
# The default GPU schedule of an untuned kernel is dlight's (tvm.s_tir.dlight.gpu: Matmul,
# GEMV, Reduction, GeneralReduction, Fallback); these constants mirror its CUDA configs.
DLIGHT_GEMM_BLOCK = (16, 8)      # threads (y, x) of dlight's Matmul rule on cuda/rocm
DLIGHT_GEMM_MICRO = (4, 4, 16)   # per-thread micro tile (y, x) and the k step
DLIGHT_GEMM_PAD = 2              # storage_align offset (the vector size) on each row
DLIGHT_REDUCE_THREADS = 256      # dlight's GEMV / GeneralReduction block size on cuda
WMMA_MIN_EXTENT = 64             # dlight tensorizes only when every extent is > 64
WMMA_BLOCK = (16, 32)            # dlight's WMMA path: 16 warps (threadIdx.y) x 32 lanes
WMMA_TILE = (128, 128, 64)       # block tile M, N, K: 2 x 4 wmma 16x16x16 per dim, 4 k steps
WMMA_PAD = 8                     # storage_align offset of each staged row (fp16 elements)
WMMA_STAGES = 2                  # its software pipeline double-buffers A and B
# Registers per thread: calibrated on nvcc 13.0's ptxas for sm_80 and sm_90 against the
# kernels of the embedded model and MiniLM-L3 (tests/test_gpu.py re-checks them):
# simt GEMM 56-72 (16 accumulators, 2 x 8 operand values, addressing), WMMA GEMM 116
# (4 accumulator fragments of 8 fp32, operand fragments), reductions 15-28, elementwise
# Fallback 8-32, the plain-loop kernels of a split group 8-64. Registers depend on
# ptxas, not only on the schedule: the exact-schedule classes carry a tolerance
# (GPU_REGISTER_TOLERANCE), the Fallback ones are upper bounds.
GEMM_REGISTERS = 64
WMMA_REGISTERS = 112
REDUCE_REGISTERS = 24
FALLBACK_REGISTERS = 32          # an upper bound: plain elementwise loops use 8-32
SPLIT_REGISTERS = 64             # an upper bound: a plain-loop GEMM stage uses up to 64
GPU_REGISTER_TOLERANCE = 16      # |nvcc - estimate| registers, for exact-schedule classes


@dataclass(frozen=True, kw_only=True)
class GpuResources:
    """Predicted resources of a group's kernel under dlight's default GPU schedule.

    Attributes
    ----------
    schedule : str
        ``gemm`` (dlight Matmul, SIMT), ``gemm-tensorcore`` (dlight's WMMA path: fp16
        operands, every extent > 64, sm_70+), ``reduction`` (GEMV / Reduction /
        GeneralReduction: one block per row), ``elementwise`` (Fallback) or ``split``:
        dlight has no rule for the fused group (a contraction with a reduction epilogue,
        two contractions), so Fallback emits one plain kernel per stage and the fusion the
        planner counted on is lost unless a tuned schedule replaces it.
    kernels : int
        Kernels the default schedule launches (``split``: at least this many).
    threads_per_block, registers_per_thread, shared_bytes : int
        Per kernel. ``shared_bytes`` is exact for ``gemm``; for ``reduction`` an upper
        bound (staging per warp, 64-byte aligned arrays).
    """

    schedule: str
    kernels: int
    threads_per_block: int
    registers_per_thread: int
    shared_bytes: int

    @property
    def registers_per_block(self) -> int:
        """Registers one block holds."""
        return self.registers_per_thread * self.threads_per_block


def gpu_resources(model: "AnalyticalCostModel", nodes: Iterable[int]) -> GpuResources:
    """Registers, shared memory and threads per block of a group on a GPU target.

    The group is classified as dlight's default rules would schedule its fused PrimFunc
    (module constants above). A contraction with out rows M = prod(shape[:-1]) > 1
    and nothing else reducing is dlight's tiled Matmul: 128 threads, each a 4 x 4 micro
    tile; shared memory holds a 64 x 16 tile of A and a 32 x 16 tile of B, rows padded by
    the vector size: ``(64 + 32) * (16 + 2) * operand bytes`` (6912 B in fp32). Tensor
    cores (fp16 operands, M, N, K > 64, cuda sm_70+): dlight's WMMA path, 512 threads,
    a 128 x 128 block tile, k step 64, A and B staged in fp16 with 8-element row padding
    and double-buffered: ``2 * (128 + 128) * (64 + 8) * 2`` bytes (72 KB, dynamic shared
    memory: above the 48 KB static limit, within A100's 163 KB opt-in).
    A GEMV (M = 1) or row reduction: 256 threads (a single-pass sum or mean over the
    innermost axes: dlight's Reduction rule, up to 1024 on cuda), one partial sum per
    thread in shared memory at most (``threads * 4`` B). Elementwise: the target's max
    threads, no shared memory. Anything else is ``split`` (see :class:`GpuResources`).
    """
    hw = model.hw
    members = sorted(set(nodes))
    roles = [model.infos[n].role for n in members]
    # a contraction with one output row (a GEMV: M = 1) is a row reduction to dlight
    contractions = [n for n, r in zip(members, roles)
                    if r == "contraction" and _contraction_rows(model, n) > 1]
    reductions = [n for n, r in zip(members, roles)
                  if r == "reduction" or (r == "contraction" and n not in contractions)]
    max_threads = int(hw.tvm_config.get("max_threads_per_block", hw.max_threads_per_block))
    if not contractions and not reductions:
        return GpuResources(schedule="elementwise", kernels=1, threads_per_block=max_threads,
                            registers_per_thread=FALLBACK_REGISTERS, shared_bytes=0)
    if contractions and (len(contractions) > 1 or reductions):
        passes = sum(max(model.infos[n].passes, 1) for n in reductions)
        return GpuResources(schedule="split", kernels=len(contractions) + passes + 1,
                            threads_per_block=max_threads,
                            registers_per_thread=SPLIT_REGISTERS, shared_bytes=0)
    if reductions:
        threads = _inner_reduction_threads(model, reductions, hw) or DLIGHT_REDUCE_THREADS
        return GpuResources(schedule="reduction", kernels=1, threads_per_block=threads,
                            registers_per_thread=REDUCE_REGISTERS, shared_bytes=threads * 4)
    nid = contractions[0]
    node, info = model.graph.nodes[nid], model.infos[nid]
    shape = [int(d) for d in node.shape] or [1]
    conv = _is_conv(node)
    n_out = shape[1] if conv else shape[-1]
    rows = _contraction_rows(model, nid)
    dtype = model.operand_dtype(nid)
    arch = str(hw.tvm_config.get("arch", ""))
    sm = int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0
    i_ext = rows if conv or len(shape) < 2 else shape[-2]
    if (dtype == "float16" and sm >= 70
            and min(i_ext, n_out, info.reduce_len) > WMMA_MIN_EXTENT):
        (ty, tx), (bm, bn, bk), pad, stages = WMMA_BLOCK, WMMA_TILE, WMMA_PAD, WMMA_STAGES
        return GpuResources(schedule="gemm-tensorcore", kernels=1, threads_per_block=ty * tx,
                            registers_per_thread=WMMA_REGISTERS,
                            shared_bytes=stages * (bm + bn) * (bk + pad) * 2)
    by, bx = DLIGHT_GEMM_BLOCK
    my, mx, mk = DLIGHT_GEMM_MICRO
    nbytes = max(tvm_bits(dtype) // 8, 1)
    return GpuResources(schedule="gemm", kernels=1, threads_per_block=by * bx,
                        registers_per_thread=GEMM_REGISTERS,
                        shared_bytes=(by * my + bx * mx) * (mk + DLIGHT_GEMM_PAD) * nbytes)


def _inner_reduction_threads(model, reductions, hw) -> int | None:
    """Threads of dlight's Reduction rule for one single-pass reduction over the
    innermost axes of a computed tensor (a sum, a mean): the largest power of two up to
    the row length and 1024 (cuda) or 256 (rocm), as its suggest_threads_per_block
    gives; None for the other cases (GEMV, softmax, layer norm: 256 threads)."""
    if len(reductions) != 1:
        return None
    nid = reductions[0]
    info, node = model.infos[nid], model.graph.nodes[nid]
    if info.role != "reduction" or info.passes != 1 or not node.inputs:
        return None
    trailing = 1
    for dim in reversed(model.graph.nodes[node.inputs[0]].shape):
        if trailing >= info.reduce_len:
            break
        trailing *= int(dim)
    if trailing != info.reduce_len:  # reduces an outer axis: another dlight schedule
        return None
    cap = 1024 if hw.family == "cuda" else 256
    return 1 << (min(info.reduce_len, cap).bit_length() - 1)


def _is_conv(node) -> bool:
    return node.op.startswith("conv") and len(node.shape) >= 3


def _contraction_rows(model, nid: int) -> int:
    """Output rows of a contraction as dlight normalizes it to C[batch, I, J]: J is a
    conv's output channels (NCHW) or a matmul's last dim, the rows are the rest."""
    node = model.graph.nodes[nid]
    shape = [int(d) for d in node.shape] or [1]
    n_out = shape[1] if _is_conv(node) else shape[-1]
    return model.infos[nid].out_elems // max(n_out, 1)


def tvm_bits(dtype: str) -> int:
    """Bits of one element of ``dtype`` (``float16`` -> 16)."""
    digits = "".join(c for c in dtype if c.isdigit())
    return int(digits) if digits else 32


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
