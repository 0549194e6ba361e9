"""CPU schedule rules that MetaSchedule's defaults cannot express (``search_spaces/cpu.json``).

Three ``PyScheduleRule`` s, each adding design spaces next to the stock ones (the block's
unchanged schedule is always kept, so MultiLevelTiling still offers its SSRSRS spaces and
the search picks between them):

- ``register_tile``: a contraction (matmul, conv) as MLAS computes it: an MR x NR tile of
  vector FMAs, NR a multiple of the target's vector lanes, MR rows of the operand that is
  broadcast, the reductions innermost-but-one, the tile's accumulators in registers, the
  outer tiles parallel, and the fused epilogue (bias, activation, residual) computed at
  the tile. After RewriteLayout the constant operand is read in NR-column panels.
- ``depthwise``: a window reduction without a broadcast row operand (depthwise conv):
  output columns (or channels, when they are the innermost axis) in vector lanes and
  several output rows / columns per tile as accumulators.
- ``plain``: "vectorize the innermost loop, parallelize the outer ones" for a kernel's
  elementwise blocks and small reductions, so a tiny kernel is not multi-level tiled.

They are Python rules, not ``ApplyCustomRule`` functions (those need every kernel's blocks
annotated before tuning) nor a TensorIntrin (an intrinsic fixes MR and NR; here they are
``sample_perfect_tile`` decisions the search mutates and the cost model ranks). A block a
rule scheduled is annotated ``schedule_rule``, which makes PostOrderApply skip it in the
rules that follow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.mutator import PyMutator
from tvm.s_tir.meta_schedule.schedule_rule import PyScheduleRule
from tvm.target.codegen import target_has_features
from tvm.sym.analyzer import Analyzer
from tvm.sym.pattern import detect_linear_equation
from tvm.tirx.analysis import undefined_vars

MARK = "schedule_rule"  # PostOrderApply skips blocks carrying it in later rules
LOOP_MARK = "tvm_fusion.own_loop"


@dataclass(frozen=True, kw_only=True)
class RegisterTileConfig:
    """``register_tile`` / ``depthwise``: one design space per entry of ``row_limits``.

    Rows of a tile go up to the entry, vector columns up to the accumulators left:
    ``(vector registers - spare_registers) // rows``. Loops smaller than
    ``min_iterations`` (all loop extents multiplied) are left to the other rules.

    With ``fill_percent`` the tile is drawn from the tiles that fill the register file
    instead (:func:`filling_tiles`): one space per row count MR up to ``max(row_limits)``,
    NR / lanes a ``sample_categorical`` over the column counts whose MR x NR / lanes
    accumulators are at least ``fill_percent`` % of the fullest tile that fits. Without it
    MR and NR / lanes are independent ``sample_perfect_tile`` draws, and most draws leave
    most registers unused.
    """

    row_limits: tuple[int, ...]
    spare_registers: int
    min_iterations: int
    fill_percent: int | None = None


@dataclass(frozen=True, kw_only=True)
class PlainConfig:
    """``plain``: blocks of at most ``max_iterations``; up to ``max_unroll_vectors`` vectors.

    ``serial`` adds a variant without the parallel loop (a kernel of a few microseconds
    loses more to the thread pool than it gains).
    """

    max_iterations: int
    max_unroll_vectors: int
    serial: bool


def vector_shape(target) -> tuple[int, int] | None:
    """(fp32 lanes, vector registers) of an LLVM target, None without a vector unit."""
    if target_has_features(["avx512f"], target):
        return 16, 32
    if target_has_features(["avx2"], target) or target_has_features(["avx"], target):
        return 8, 16
    if target_has_features(["neon"], target):
        return 4, 32
    return None


def _extent(sch, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tvm.tirx.IntImm) else None


def _vars(expr) -> set:
    return {v.name for v in undefined_vars(expr)}


def _region_vars(blk, access) -> list[set]:
    """Per dimension of ``access``, the block iterators its index reads, once simplified
    over the iterators' ranges (a grouped conv's ``(o * 16 + lane) // 128`` reads none)."""
    an = Analyzer()
    for iv in blk.iter_vars:
        an.bind(iv.var, iv.dom)
    return [_vars(an.simplify(r.min)) for r in access.region]


@dataclass(frozen=True)
class _Nest:
    """A block bound one loop per iterator: spatial, reduction and the lane iterator."""

    spatial: tuple[int, ...]   # iterator positions, outer to inner
    reduction: tuple[int, ...]
    names: tuple[str, ...]     # iterator names
    extents: tuple[int, ...]


def _blocks_under(stmt) -> list:
    """The blocks directly under ``stmt`` (through loops and sequences, not into blocks)."""
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        return [stmt.block]
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return [b for s in stmt.seq for b in _blocks_under(s)]
    body = getattr(stmt, "body", None)
    return _blocks_under(body) if body is not None else []


def _loops(sch, block_stmt) -> list:
    """The loops around a block, outer to inner, read from the IR: analysis must not add
    instructions to the trace of the schedule it leaves unchanged."""
    sref = sch.state.get_sref(block_stmt).parent
    loops = []
    while sref is not None and isinstance(sref.stmt, tvm.tirx.For):
        loops.append(sref.stmt)
        sref = sref.parent
    return loops[::-1]


def _nest(sch, blk) -> _Nest | None:
    """The iterators of block ``blk`` (an SBlock) if each is bound to its own loop, in
    order, and the loops hold this block alone; else None."""
    loops = _loops(sch, blk)
    if not loops or len(loops) != len(blk.iter_vars) or blk.annotations:
        return None
    if len(_blocks_under(loops[0])) != 1:
        return None
    realize = loops[-1].body
    if not isinstance(realize, tvm.s_tir.SBlockRealize) or not realize.block.same_as(blk):
        return None
    spatial, reduction, exts = [], [], []
    for k, (iv, val, loop) in enumerate(zip(blk.iter_vars, realize.iter_values, loops)):
        if not val.same_as(loop.loop_var) or not isinstance(loop.extent, tvm.tirx.IntImm):
            return None
        exts.append(int(loop.extent))
        (spatial if iv.iter_type == 0 else reduction).append(k)
    if reduction and max(spatial, default=-1) > min(reduction):
        return None  # spatial loops inside reductions: not a nest these rules rewrite
    return _Nest(tuple(spatial), tuple(reduction),
                 tuple(iv.var.name for iv in blk.iter_vars), tuple(exts))


def _contraction(blk, nest: _Nest, lanes: int):
    """(lanes, rows, columns) iterators of ``C[..., j] += X * Y``; None if not one.

    The lane iterator ``j`` is the output's last index; the operand that does not read it
    is broadcast into the lanes. ``rows`` is the innermost spatial iterator the broadcast
    operand reads and the vector operand does not (a GEMM's ``i``, an NCHW conv's output
    channel, an NCHWc conv's output column), ``columns`` the innermost one the vector
    operand reads and the broadcast one does not (an NCHWc conv's channel chunk), which
    widens a tile whose lanes are all of ``j``. A depthwise conv has no rows: its weight
    shares the channel with the input (in NCHWc both operands read the lanes).
    """
    if not nest.reduction or len(blk.writes) != 1 or blk.init is None:
        return None
    store = blk.body
    if not isinstance(store, tvm.tirx.BufferStore):
        return None
    out = blk.writes[0].source
    reads = [r for r in blk.reads if not r.source.same_as(out)]
    if len(reads) != 2 or not isinstance(store.value, tvm.tirx.Add):
        return None
    j = nest.spatial[-1]
    if _region_vars(blk, blk.writes[0])[-1] != {nest.names[j]} or nest.extents[j] % lanes:
        return None
    used = [set().union(*_region_vars(blk, rd)) for rd in reads]
    vec = [k for k in range(2) if nest.names[j] in used[k]]
    if not vec:
        return None
    if len(vec) == 2:
        return j, None, None
    bcast, vector = used[1 - vec[0]], used[vec[0]]

    def innermost(reads_it, skips_it):
        found = [s for s in nest.spatial[:-1] if nest.names[s] in reads_it
                 and nest.names[s] not in skips_it and nest.extents[s] > 1]
        return found[-1] if found else None
    cols = innermost(vector, bcast) if nest.extents[j] == lanes else None
    return j, innermost(bcast, vector), cols


def _elementwise(producer, consumer) -> bool:
    """Whether ``consumer`` reads ``producer``'s output at its own point and writes there:
    computed at a tile of the producer, it then reads exactly what the tile made (a
    transpose or reshape would read outside it)."""
    out = producer.writes[0].source
    reads = [r for r in consumer.reads if r.source.same_as(out)]
    ivs = [iv.var for iv in consumer.iter_vars]
    if len(reads) != 1 or len(consumer.writes) != 1 or any(iv.iter_type != 0
                                                           for iv in consumer.iter_vars):
        return False

    def at_own_point(region):
        return len(region) == len(ivs) and all(
            r.min.same_as(v) and isinstance(r.extent, tvm.tirx.IntImm) and int(r.extent) == 1
            for r, v in zip(region, ivs))
    return at_own_point(reads[0].region) and at_own_point(consumer.writes[0].region)


def _epilogue(sch, block, at) -> list:
    """Compute the block's chain of elementwise consumers at loop ``at``; else a write cache.

    Returns the blocks now under ``at`` after the update (their loops to vectorize).
    """
    placed, tail = [], block
    while True:
        consumers = sch.get_consumers(tail)
        if len(consumers) != 1 or not _elementwise(sch.get(tail), sch.get(consumers[0])):
            break
        sch.reverse_compute_at(consumers[0], at, preserve_unit_loops=True)
        placed.append(consumers[0])
        tail = consumers[0]
    if not placed:  # the accumulators get their own small buffer, written back per tile
        cache = sch.cache_write(block, 0, "global")
        sch.reverse_compute_at(cache, at, preserve_unit_loops=True)
        placed.append(cache)
    return placed


def _own(sch, loop, parallel: bool = False) -> None:
    """Parallelize or vectorize ``loop`` and annotate it, so that MetaSchedule's
    RewriteParallelVectorizeUnroll (which looks only at annotations) leaves it alone."""
    (sch.parallel if parallel else sch.vectorize)(loop)
    sch.annotate(loop, LOOP_MARK, 1)


def _vectorize_tail(sch, blocks, lanes: int) -> None:
    for b in blocks:
        loops = sch.get_loops(b)
        ext = _extent(sch, loops[-1])
        if ext is not None and ext % lanes == 0 and ext > 0:
            outer, inner = sch.split(loops[-1], [None, lanes])
            _own(sch, inner)
        sch.annotate(b, MARK, "tvm_fusion.epilogue")


def register_tile(sch, block, nest: _Nest, j: int, rows: int, cols: int | None,
                  max_rows: int, max_vecs: int, lanes: int,
                  mark: str = "register_tile",
                  fill: tuple[int, tuple[int, ...]] | None = None, cores: int = 1) -> None:
    """Schedule ``block`` as an MR x NR vector-FMA tile (see the module docstring).

    ``rows`` is the iterator whose MR values share one broadcast; MR and NR / lanes are
    ``sample_perfect_tile`` decisions bounded by ``max_rows`` and ``max_vecs``. The NR / lanes
    vectors split ``j`` beyond its lanes, or, given, the ``cols`` iterator (``j`` is then
    exactly one vector). ``fill`` = (MR, candidate NR / lanes counts) fixes MR and draws
    NR / lanes from the candidates (:func:`filling_tiles`), and the parallel loop then
    has at least ``cores`` iterations wherever the tile count allows
    (:func:`_parallel_splits`).
    """
    loops = sch.get_loops(block)
    outer, middle = [], []
    for s in nest.spatial:
        if s in (j, rows, cols):
            continue
        o, m = sch.split(loops[s], sch.sample_perfect_tile(loops[s], n=2,
                                                           max_innermost_factor=64))
        outer.append(o)
        middle.append(m)
    if cols is None:
        jo, jv = sch.split(loops[j], [None, lanes])
    else:
        jo, jv = loops[cols], loops[j]
    if fill is None:
        r0, r1, r2 = sch.split(loops[rows], sch.sample_perfect_tile(
            loops[rows], n=3, max_innermost_factor=max_rows))
        j0, j1, j2 = sch.split(jo, sch.sample_perfect_tile(jo, n=3,
                                                           max_innermost_factor=max_vecs))
    else:
        mr, nvs = fill
        col_tiles = math.gcd(*(_extent(sch, jo) // v for v in nvs))
        rr, r2 = sch.split(loops[rows], [None, mr])
        nv = sch.sample_categorical(list(nvs), [1.0 / len(nvs)] * len(nvs))
        jr, j2 = sch.split(jo, [None, nv])
        (r0, r1), (j0, j1) = _parallel_splits(sch, rr, jr, _extent(sch, rr), col_tiles,
                                              cores)
    red = [loops[r] for r in nest.reduction]
    # j1 outside r1: one NR-column panel of the packed operand stays in cache while
    # the MR-row strips of the other stream past it
    sch.reorder(*outer, r0, j0, *middle, j1, r1, *red, r2, j2, jv)
    tail = _epilogue(sch, block, r1)
    sch.unroll(r2)
    sch.unroll(j2)
    _own(sch, sch.fuse(*outer, r0, j0), parallel=True)
    _own(sch, jv)
    sch.annotate(block, MARK, f"tvm_fusion.{mark}")
    sch.decompose_reduction(block, red[0])
    _vectorize_tail(sch, tail, lanes)


def parallel_factors(extent: int, cores: int) -> list[int]:
    """The outer factors of a loop of ``extent`` tiles that give every core a job:
    divisors of ``extent`` of at least ``cores``, at most ``4 * cores`` (more jobs only
    add thread-pool overhead; a loaded machine's straggler is the reason for more than
    one per core); empty when ``extent`` has none."""
    return [d for d in range(cores, min(extent, 4 * cores) + 1) if extent % d == 0]


def _parallel_splits(sch, rr, jr, row_tiles: int, col_tiles: int, cores: int):
    """Split the row and column tile loops into (parallel, serial) pairs so that the
    parallel part has at least ``cores`` jobs: the column tiles' parallel factor is a
    categorical over :func:`parallel_factors` (a sampled perfect tile can be 1: a
    128x384x384 matmul ran on one of two cores), the rows' a perfect tile; the rows carry
    the parallelism when the columns cannot, and both are perfect tiles when neither can
    (a small kernel). ``col_tiles`` divides the column tile count of every NR / lanes
    candidate, so the trace stays valid when the search redraws NR / lanes."""
    def tile(loop):
        return sch.split(loop, sch.sample_perfect_tile(loop, n=2, max_innermost_factor=64))

    def forced(loop, factors):
        return sch.split(loop, [sch.sample_categorical(
            factors, [1.0 / len(factors)] * len(factors)), None])
    if cores > 1 and parallel_factors(col_tiles, cores):
        return tile(rr), forced(jr, parallel_factors(col_tiles, cores))
    if cores > 1 and parallel_factors(row_tiles, cores):
        return forced(rr, parallel_factors(row_tiles, cores)), tile(jr)
    return tile(rr), tile(jr)


def filling_tiles(n_rows: int, n_cols: int, max_rows: int, budget: int,
                  fill_percent: int) -> list[tuple[int, tuple[int, ...]]]:
    """The register tiles that fill the accumulator budget, grouped by row count.

    A tile is MR rows x NV vectors with MR dividing ``n_rows`` (at most ``max_rows``), NV
    dividing ``n_cols`` and MR * NV <= ``budget`` accumulators; kept are those with at
    least ``fill_percent`` % of the accumulators of the fullest such tile, of those the
    ones with at most 3 operand loads per 4 FMAs, if any, and of those the ones with NV
    <= MR, if any.

    Returns
    -------
    list of (MR, NV candidates), MR ascending, NV candidates ascending
    """
    pairs = [(mr, nv) for mr in range(1, min(n_rows, max_rows) + 1) if n_rows % mr == 0
             for nv in range(1, n_cols + 1) if n_cols % nv == 0 and mr * nv <= budget]
    if not pairs:
        return []
    best = max(mr * nv for mr, nv in pairs)
    keep = [(mr, nv) for mr, nv in pairs if 100 * mr * nv >= fill_percent * best]
    # MR + NV operand loads per MR * NV FMAs: past 3 per 4 the load ports, not the FMAs,
    # bound the tile (a 14 x 1 tile measured 1.25x slower than 7 x 2 on an NCHW16c conv)
    fed = [(mr, nv) for mr, nv in keep if 4 * (mr + nv) <= 3 * mr * nv]
    keep = fed or keep
    # no more vectors than rows: the NV loads stream the packed panel, the MR broadcasts
    # re-read one row strip (2 x 8 measured 1.3x slower than 7 x 2 on the NCHW16c conv,
    # 2 x 6..12 1.3-1.7x slower than 4 x 4 or 8 x 2 on MiniLM's 128x384x384 matmul)
    tall = [(mr, nv) for mr, nv in keep if nv <= mr]
    keep = tall or keep
    rows = sorted({mr for mr, _ in keep})
    return [(mr, tuple(nv for m, nv in keep if m == mr)) for mr in rows]


@derived_object
class RegisterTileRule(PyScheduleRule):
    """``register_tile`` (``depthwise=False``) or ``depthwise``: vector-FMA register tiles."""

    def __init__(self, config: RegisterTileConfig, depthwise: bool = False):
        self.config, self.depthwise, self.shape, self.cores = config, depthwise, None, 1

    def _initialize_with_tune_context(self, context) -> None:
        self.shape = vector_shape(context.target) if context.target is not None else None
        self.cores = _cores(context.target)

    def apply(self, sch, block):
        if self.shape is None:
            return [sch]
        lanes, regs = self.shape
        blk = sch.get(block)
        nest = _nest(sch, blk)
        if nest is None or _iterations(nest) < self.config.min_iterations:
            return [sch]
        match = _contraction(blk, nest, lanes)
        if match is None:
            return [sch]
        j, rows, cols = match
        if self.depthwise:
            if rows is not None:
                return [sch]
            cols = None
            # several output rows (NCHW) or columns (NCHWc) per tile share nothing but
            # the weight broadcast; they are the accumulators
            cand = [s for s in nest.spatial[:-1] if nest.extents[s] > 1]
            if not cand:
                return [sch]
            rows = cand[-1]
        elif rows is None:
            return [sch]
        out = [sch]
        budget = regs - self.config.spare_registers
        if self.config.fill_percent is None:
            spaces = [(r, budget // r, None) for r in self.config.row_limits
                      if budget // r >= 1]
        else:
            n_cols = nest.extents[j] // lanes if cols is None else nest.extents[cols]
            tiles = filling_tiles(nest.extents[rows], n_cols, max(self.config.row_limits),
                                  budget, self.config.fill_percent)
            spaces = [(mr, max(nvs), (mr, nvs)) for mr, nvs in tiles]
        for max_rows, max_vecs, fill in spaces:
            new = sch.copy()
            try:
                register_tile(new, block, nest, j, rows, cols, max_rows, max_vecs, lanes,
                              "depthwise" if self.depthwise else "register_tile", fill,
                              self.cores)
            except RuntimeError:  # ScheduleError, InternalError: this nest cannot take the tile
                continue
            out.append(new)
        return out

    def clone(self):
        rule = RegisterTileRule(self.config, self.depthwise)
        rule.shape, rule.cores = self.shape, self.cores
        return rule


def _cores(target) -> int:
    """The target's ``num-cores`` (MetaSchedule's own source of it), 1 when absent."""
    if target is None:
        return 1
    n = target.attrs.get("num-cores")
    return int(n) if n is not None and int(n) > 0 else 1


def _iterations(nest: _Nest) -> int:
    n = 1
    for e in nest.extents:
        n *= e
    return n


def _plain_lanes(blk, nest: _Nest, lanes: int) -> int | None:
    """The innermost spatial iterator if every access reads it with stride 1 or not at all."""
    if not nest.spatial or nest.extents[nest.spatial[-1]] % lanes:
        return None
    v = nest.spatial[-1]
    var = blk.iter_vars[v].var
    for acc in list(blk.reads) + list(blk.writes):
        *rest, last = [r.min for r in acc.region] or [None]
        if any(var.name in used for used in _region_vars(blk, acc)[:-1]):
            return None  # a strided (gathering) access along the lanes
        if last is not None and var.name in _vars(last):
            coef = detect_linear_equation(last, [var])
            if len(coef) != 2 or not isinstance(coef[0], tvm.tirx.IntImm) \
                    or int(coef[0]) != 1:
                return None
    return v


def plain(sch, block, nest: _Nest, lanes: int, max_unroll: int, parallel: bool) -> None:
    """Parallel outer loops, reductions, then unrolled vectors of the innermost loop."""
    loops = sch.get_loops(block)
    v = _plain_lanes(sch.get(block), nest, lanes)
    spatial = [loops[s] for s in nest.spatial if s != v]
    red = [loops[r] for r in nest.reduction]
    inner = []
    if v is not None:
        vo, vl = sch.split(loops[v], [None, lanes])
        vo, vu = sch.split(vo, sch.sample_perfect_tile(vo, n=2,
                                                       max_innermost_factor=max_unroll))
        spatial.append(vo)
        inner = [vu, vl]
        sch.reorder(*spatial, *red, vu, vl)
        sch.unroll(vu)
        _own(sch, vl)
    if spatial:
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        if parallel:
            _own(sch, fused, parallel=True)
        else:
            sch.annotate(fused, LOOP_MARK, 1)
    sch.annotate(block, MARK, "tvm_fusion.plain")
    if red and inner:
        sch.decompose_reduction(block, red[0])


@derived_object
class PlainRule(PyScheduleRule):
    """``plain``: at the kernel's root block, one space (two with ``serial``) in which
    every eligible block is scheduled by :func:`plain`: elementwise blocks and reductions
    of at most ``max_iterations``, except the epilogues of larger contractions (those
    belong to the tile that produces them)."""

    def __init__(self, config: PlainConfig):
        self.config, self.shape = config, None

    def _initialize_with_tune_context(self, context) -> None:
        self.shape = vector_shape(context.target) if context.target is not None else None

    def apply(self, sch, block):
        if self.shape is None or sch.get(block).name_hint != "root" \
                or sch.get_sref(block).parent is not None:
            return [sch]
        lanes = self.shape[0]
        root = sch.get(block)
        scope = sch.state.get_sblock_scope(sch.get_sref(block))
        picks, big = [], set()
        for blk in _blocks_under(root.body):
            nest = _nest(sch, blk)
            reduces = any(iv.iter_type != 0 for iv in blk.iter_vars)
            if nest is None or (reduces and _iterations(nest) > self.config.max_iterations):
                if reduces:
                    big.add(blk.name_hint)
                continue
            picks.append((blk, nest))
        # epilogues of the contractions left to the tiling rules stay with them
        picks = [(blk, n) for blk, n in picks if not any(
            d.src.stmt.name_hint in big for d in scope.get_deps_by_dst(sch.state.get_sref(blk)))]
        if not picks:
            return [sch]
        out = [sch]
        for parallel in (True, False) if self.config.serial else (True,):
            new = sch.copy()
            try:
                for blk, nest in picks:
                    plain(new, new.get_sblock(blk.name_hint), nest, lanes,
                          self.config.max_unroll_vectors, parallel)
            except RuntimeError:  # TVM 0.27 has no tvm.TVMError: its errors are RuntimeErrors
                continue
            out.append(new)
        return out

    def clone(self):
        return PlainRule(self.config)


@derived_object
class MutateTileChoice(PyMutator):
    """``tile_choice``: redraw one categorical tile size (``register_tile``'s NR / lanes).

    MetaSchedule's MutateTileSize changes ``sample_perfect_tile`` decisions and
    MutateUnroll only the categoricals that pick an unroll depth; this changes a
    categorical that feeds a ``split`` to another of its candidates.
    """

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, rand_state):
        factors = [x for i in trace.insts if i.kind.name == "Split" for x in i.inputs[1:]
                   if x is not None]
        picks = [i for i in trace.insts if i.kind.name == "SampleCategorical"
                 and len(i.attrs[0]) > 1
                 and any(i.outputs[0].same_as(x) for x in factors)]
        if not picks:
            return None
        rng = np.random.default_rng(int(rand_state) & 0x7FFFFFFF)
        inst = picks[int(rng.integers(len(picks)))]
        now = int(trace.decisions[inst])
        other = [k for k in range(len(inst.attrs[0])) if k != now]
        return trace.with_decision(inst, int(other[int(rng.integers(len(other)))]), True)

    def clone(self):
        return MutateTileChoice()
