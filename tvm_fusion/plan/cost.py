"""Analytical cost of a candidate kernel (a group of operators) on a target.

Every number is hand-computable from the op graph and ``hw_targets/<name>.json``:

``dram_bytes``
    external inputs + escaping outputs + ``spill_bytes``. External inputs: each
    constant/model input a member reads, and each tensor produced outside the group
    (once, however many members read it). Escaping outputs: members read outside the
    group or returned by the model. Intermediates read only inside stay on chip.
``staged_bytes`` (the working set one block or core task must hold)
    For a multi-pass reduction (``passes`` >= 2: softmax, layer norm) whose producer is
    in the group, one row of its input: ``reduce_len * dtype bytes``. Elementwise chains
    and GEMM epilogues stream through registers and stage nothing.
``onchip_bytes`` (the capacity it is checked against)
    GPUs: ``usable_shared_memory_per_block`` (shared memory / LDS one TVM kernel may
    use: A100 48 KB, TVM's static limit; MI250X 64 KB). CPUs: ``l2_bytes_per_unit``
    (private L2 per core; ``llc_bytes / compute_units`` when there is none).
``spill_bytes``, ``recompute_flops``
    A multi-pass reduction whose row does not fit re-reads its input once per extra pass
    (``(passes-1) * input bytes``), or, when its producers are fused in, recomputes them
    once per extra pass (``(passes-1) *`` their FLOPs and their external input bytes).
``compute_us``
    sum of FLOPs / the peak of the unit that runs them: ``<dtype>_matrix`` for fp16,
    bf16 and int8 contractions where the target has one, else ``<dtype>_vector``
    (fp32_vector when the dtype has no entry).
``memory_us``
    ``dram_bytes / dram_bandwidth_gbs``.
``tiles``, ``parallel_fraction``
    Independent output tiles of the group: the minimum over its members of
    ceil(out elements / 256) for elementwise ops, ceil(out elements / 4096) (64x64
    tiles) for contractions, rows for reductions. ``parallel_fraction`` =
    min(1, tiles / compute_units): a group with 16 tiles keeps 16 of A100's 108 SMs busy.
``total_us``
    ``max(compute_us, memory_us) / parallel_fraction + launch_overhead_us``.

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
from .op_info import OpInfo, graph_info

ELEM_TILE = 256    # elements per independent tile of an elementwise op (one 256-thread block)
GEMM_TILE = 4096   # output elements per GEMM/conv tile (64 x 64)
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


def onchip_capacity(hw) -> int:
    """Bytes one block (GPU) or one core's task (CPU) may keep on chip."""
    if hw.family == "cpu":
        return hw.l2_bytes_per_unit or hw.llc_bytes // max(hw.compute_units, 1)
    return hw.usable_shared_memory_per_block


def peak_flops(hw, dtype: str, *, matrix: bool) -> float:
    """FLOP/s of the unit that runs an op of ``dtype`` (see the module docstring)."""
    key = _DTYPE_KEY.get(dtype, "fp32")
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
    terms.compute_s += node.flops / peak_flops(model.hw, node.dtype, matrix=matrix)
    terms.tiles = min(terms.tiles, tiles)


@cost_rule("elementwise")
@cost_rule("opaque")
def _elementwise(model, nid, members, terms):
    """FLOPs on the vector units; one tile per 256 output elements."""
    info = model.infos[nid]
    _add_op(model, nid, terms, matrix=False, tiles=math.ceil(info.out_elems / ELEM_TILE))


@cost_rule("contraction")
def _contraction(model, nid, members, terms):
    """FLOPs on the matrix units where the dtype has one; one tile per 64x64 outputs."""
    info = model.infos[nid]
    _add_op(model, nid, terms, matrix=True, tiles=math.ceil(info.out_elems / GEMM_TILE))


@cost_rule("reduction")
def _reduction(model, nid, members, terms):
    """One tile per row; a multi-pass reduction stages, re-reads or recomputes its row."""
    info = model.infos[nid]
    _add_op(model, nid, terms, matrix=False, tiles=info.rows)
    if info.passes < 2:
        return
    row = info.reduce_len * info.dtype_bytes
    fused_in = model.ancestors_in(nid, members)
    if fused_in:
        terms.staged_bytes = max(terms.staged_bytes, row)
    if row <= onchip_capacity(model.hw):
        return
    extra = info.passes - 1
    if not fused_in:  # re-read the input from DRAM once per extra pass
        terms.spill_bytes += extra * info.in_bytes
        return
    for a in fused_in:  # recompute the fused producers once per extra pass
        anode = model.graph.nodes[a]
        terms.recompute_flops += extra * anode.flops
        terms.compute_s += extra * anode.flops / peak_flops(
            model.hw, anode.dtype, matrix=model.infos[a].role == "contraction")
        terms.spill_bytes += extra * model.external_in(a, members)


class AnalyticalCostModel:
    """Cost of any group of ``graph``'s nodes on ``hw`` (see the module docstring)."""

    def __init__(self, graph: OpGraph, hw, infos: tuple[OpInfo, ...] | None = None):
        self.graph, self.hw = graph, hw
        self.infos = infos if infos is not None else graph_info(graph)
        self.users = graph.consumers()
        self.outputs = set(graph.outputs)
        self._cache: dict[frozenset, GroupCost] = {}

    def const_bytes(self, nid: int) -> int:
        """Bytes ``nid`` reads that no node produces (weights, constants, model inputs)."""
        node = self.graph.nodes[nid]
        made = sum(self.graph.nodes[p].bytes_written for p in node.inputs)
        return max(node.bytes_read - made, 0)

    def external_in(self, nid: int, members) -> int:
        """Bytes ``nid`` reads from outside ``members``."""
        node = self.graph.nodes[nid]
        return self.const_bytes(nid) + sum(self.graph.nodes[p].bytes_written
                                           for p in node.inputs if p not in members)

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

    def traffic(self, members) -> int:
        """External input bytes (each outside producer once) plus escaping outputs."""
        outside = {p for n in members for p in self.graph.nodes[n].inputs if p not in members}
        return (sum(self.const_bytes(n) for n in members)
                + sum(self.graph.nodes[p].bytes_written for p in outside)
                + sum(self.graph.nodes[n].bytes_written for n in members
                      if self.escapes(n, members)))

    def group_cost(self, nodes: Iterable[int]) -> GroupCost:
        """The :class:`GroupCost` of one kernel computing ``nodes``."""
        members = frozenset(nodes)
        if members in self._cache:
            return self._cache[members]
        terms = _Terms()
        for nid in sorted(members):
            RULES[self.infos[nid].role](self, nid, members, terms)
        hw = self.hw
        dram = self.traffic(members) + terms.spill_bytes
        frac = min(1.0, terms.tiles / max(hw.compute_units, 1))
        compute_us = terms.compute_s * 1e6
        memory_us = dram / (hw.dram_bandwidth_gbs * 1e3)
        cost = GroupCost(
            nodes=tuple(sorted(members)), flops=terms.flops + terms.recompute_flops,
            recompute_flops=terms.recompute_flops, dram_bytes=dram,
            spill_bytes=terms.spill_bytes, staged_bytes=terms.staged_bytes,
            onchip_bytes=onchip_capacity(hw), tiles=terms.tiles, parallel_fraction=frac,
            compute_us=compute_us, memory_us=memory_us, launch_us=hw.launch_overhead_us,
            total_us=max(compute_us, memory_us) / frac + hw.launch_overhead_us)
        self._cache[members] = cost
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
    on top. The four add up to the total saving; a negative term is a cost of fusing.
    """
    roof = sum(p.roofline_us for p in parts) - fused.roofline_us
    comp = sum(p.compute_us for p in parts) - fused.compute_us
    scaled = sum(p.roofline_us / p.parallel_fraction for p in parts) - (
        fused.roofline_us / fused.parallel_fraction)
    return {
        "launch overhead": sum(p.launch_us for p in parts) - fused.launch_us,
        "DRAM traffic": roof - comp,
        "compute": comp,
        "parallelism": scaled - roof,
    }
