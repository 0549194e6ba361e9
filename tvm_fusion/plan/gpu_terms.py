"""GPU terms of the predicted time: tiles, occupancy, waves and latency hiding.

Every number is hand-computable from a group's :class:`~.cost.GpuResources` (dlight's
default schedule of it) and ``hw_targets/<name>.json``:

``tiles`` (thread blocks)
    dlight's real tile per rule. Matmul on cuda/rocm (SIMT): 16 x 8 threads, each a
    4 x 4 micro tile, so a block computes 32 rows x 64 columns of C[S, I, J] (dlight
    pads I to 32 and J to 64): ``S * ceil(I / 32) * ceil(J / 64)``. WMMA (tensor
    cores): 128 x 128 per block. Reductions: one block per row. Elementwise
    (Fallback): one block per ``threads_per_block`` outputs (1024 on cuda, 256 on
    TVM's rocm target).
``blocks_per_unit`` (resident blocks per SM / CU)
    ``min(max_threads_per_unit // threads, registers_per_unit // (registers per
    thread * threads), shared_memory_bytes_per_unit // shared bytes per block,
    MAX_BLOCKS_PER_UNIT)``; ``occupancy`` = resident threads / ``max_threads_per_unit``.
``waves``
    ``ceil(tiles / (compute_units * blocks_per_unit))``. ``quantization`` =
    ``tiles / (waves * compute_units * per_unit)`` where ``per_unit`` =
    ``min(blocks_per_unit, ceil(tiles / compute_units))`` (the busiest unit's blocks in
    one wave): 16 tiles on 108 SMs keep 16/108 busy; 865 GEMM tiles at 8 per SM run
    two waves on A100, the second one nearly empty (865 / 1728).
``latency_hiding`` (memory term only)
    ``min(1, resident warps per busy unit / warps_needed)``, with Little's law for the
    warps a unit must keep in flight to cover DRAM latency at its share of the bandwidth:
    ``warps_needed = dram_bandwidth * DRAM_LATENCY_NS / compute_units / (warp_size *
    vector_width_bits / 8)`` (one vector load in flight per thread). A100: 2039 GB/s x
    500 ns / 108 / 512 B = 18.4 warps. Compute is not scaled: dlight's 4 x 4 (SIMT) and
    fragment (WMMA) tiles give each thread 16+ independent FMAs, enough ILP at 4 warps.

The memory time is ``memory_us / (quantization * latency_hiding)``, the compute time
``compute_us / quantization``; the kernel takes the larger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_BLOCKS_PER_UNIT = 32  # CUDA Programming Guide cc 8.0/9.0: 32 resident blocks per SM
# DRAM load latency under load: ~470 cycles at 1.4 GHz on A100 by microbenchmarks
# (Jia et al. style pointer chasing; "Dissecting the NVIDIA Ampere GPU", 2021); an
# estimate that the accuracy benchmark (benchmarks/planner_accuracy.py) checks.
DRAM_LATENCY_NS = 500.0
SIMT_TILE = (32, 64)       # rows I x columns J of C per block: dlight Matmul on cuda/rocm
WMMA_BLOCK_TILE = (128, 128)


@dataclass(frozen=True, kw_only=True)
class GpuOccupancy:
    """The GPU terms of one kernel (see the module docstring)."""

    tiles: int
    blocks_per_unit: int
    occupancy: float
    waves: int
    quantization: float
    latency_hiding: float

    @property
    def memory_fraction(self) -> float:
        """What divides the memory time: quantization times latency hiding."""
        return self.quantization * self.latency_hiding


def gemm_tiles(batch: int, rows: int, cols: int, schedule: str) -> int:
    """Thread blocks of dlight's Matmul over C[batch, rows, cols] (``gemm`` or
    ``gemm-tensorcore``)."""
    ti, tj = WMMA_BLOCK_TILE if schedule == "gemm-tensorcore" else SIMT_TILE
    return max(batch, 1) * math.ceil(max(rows, 1) / ti) * math.ceil(max(cols, 1) / tj)


def blocks_per_unit(hw, res) -> int:
    """Blocks of ``res`` (a :class:`~.cost.GpuResources`) resident on one SM / CU."""
    threads = max(res.threads_per_block, 1)
    limits = [hw.max_threads_per_unit // threads, MAX_BLOCKS_PER_UNIT]
    if res.registers_per_thread:
        limits.append(hw.registers_per_unit // (res.registers_per_thread * threads))
    if res.shared_bytes:
        limits.append(hw.shared_memory_bytes_per_unit // res.shared_bytes)
    return max(min(limits), 1)


def warps_needed(hw) -> float:
    """Warps one unit keeps in flight to cover DRAM latency (Little's law, see above)."""
    per_warp = max(hw.warp_size, 1) * hw.vector_width_bits / 8
    return hw.dram_bandwidth_gbs * DRAM_LATENCY_NS / max(hw.compute_units, 1) / per_warp


def occupancy(hw, res, tiles: int) -> GpuOccupancy:
    """Occupancy, waves and latency hiding of ``tiles`` blocks of ``res`` on ``hw``."""
    units = max(hw.compute_units, 1)
    tiles = max(int(tiles), 1)
    bpu = blocks_per_unit(hw, res)
    waves = math.ceil(tiles / (units * bpu))
    per_unit = min(bpu, math.ceil(tiles / units))
    warps = per_unit * math.ceil(res.threads_per_block / max(hw.warp_size, 1))
    return GpuOccupancy(
        tiles=tiles, blocks_per_unit=bpu,
        occupancy=bpu * res.threads_per_block / max(hw.max_threads_per_unit, 1),
        waves=waves, quantization=tiles / (waves * units * per_unit),
        latency_hiding=min(1.0, warps / warps_needed(hw)))
