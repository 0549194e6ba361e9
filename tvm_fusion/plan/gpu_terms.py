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
    The vendors' occupancy rules, allocation granules included. CUDA (the CUDA
    occupancy calculator, cc 8.0 / 9.0): registers go to whole warps in units of 256,
    so ``registers_per_unit // (ceil(regs * 32 / 256) * 256)`` warps fit; shared memory
    per block is rounded up to 128 B after the 1 KB the driver reserves per block; at
    most 32 blocks and ``max_threads_per_unit`` threads. CDNA2 (gfx90a, LLVM AMDGPU's
    ``getNumWavesPerEUWithNumVGPRs`` / ``getOccupancyWithLocalMemSize``): each SIMD holds
    ``min(8, 512 // align(vgprs, 8))`` waves (VGPRs and AGPRs share its 512 per lane,
    ``vgprs = align(arch VGPRs, 4) + AGPRs``), a block's waves are spread over the CU's 4
    SIMDs, LDS admits ``65536 // lds`` blocks, and at most 16 blocks of more than one
    wave (the CU's barriers). ``occupancy`` = resident threads / ``max_threads_per_unit``.
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

from ..family import CDNA_OCCUPANCY, CUDA_OCCUPANCY, strategy

MAX_BLOCKS_PER_UNIT = 32  # CUDA Programming Guide cc 8.0/9.0: 32 resident blocks per SM
CUDA_REGISTER_UNIT = 256    # registers per warp are allocated in units of 256 (cc 5.0-9.0)
CUDA_SHARED_UNIT = 128      # shared memory per block is allocated in units of 128 B
CUDA_SHARED_RESERVED = 1024  # and the driver reserves 1 KB of it per block (cc 8.0+)
CDNA_SIMDS = 4              # SIMDs per CU (AMD CDNA 2 ISA)
CDNA_WAVES_PER_SIMD = 8     # gfx90a (LLVM AMDGPU getMaxWavesPerEU)
CDNA_VGPRS = 512            # per lane per SIMD, arch VGPRs + AGPRs unified on gfx90a
CDNA_VGPR_GRANULE = 8       # gfx90a allocates VGPRs in blocks of 8 (getVGPRAllocGranule)
CDNA_MAX_GROUPS = 16        # workgroups of 2+ waves per CU: 16 barriers (getMaxWorkGroupsPerCU)
# DRAM load latency under load: ~470 cycles at 1.4 GHz on A100 by microbenchmarks
# (Jia et al. style pointer chasing; "Dissecting the NVIDIA Ampere GPU", 2021); an
# estimate that the accuracy benchmark (benchmarks/planner_accuracy.py) checks.
DRAM_LATENCY_NS = 500.0
SIMT_TILE = (32, 64)       # rows I x columns J of C per block: dlight Matmul on cuda/rocm
WMMA_BLOCK_TILE = (128, 128)
MFMA_BLOCK_TILE = (64, 64)  # schedules/mfma.py: four waves of 2 x 2 MFMA 16x16 fragments


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
    ``gemm-tensorcore``, ``gemm-mfma``)."""
    ti, tj = {"gemm-tensorcore": WMMA_BLOCK_TILE,
              "gemm-mfma": MFMA_BLOCK_TILE}.get(schedule, SIMT_TILE)
    return max(batch, 1) * math.ceil(max(rows, 1) / ti) * math.ceil(max(cols, 1) / tj)


def _align(n: int, unit: int) -> int:
    return -(-int(n) // unit) * unit


def blocks_per_unit(hw, res) -> int:
    """Blocks of ``res`` (a :class:`~.cost.GpuResources`) resident on one SM / CU, by the
    vendor's occupancy rules (the module docstring); other GPUs: plain division."""
    rules = strategy(hw).occupancy_rules
    if rules == CDNA_OCCUPANCY and hw.warp_size == 64:
        return _cdna_blocks(hw, res)
    threads = max(res.threads_per_block, 1)
    warps = -(-threads // max(hw.warp_size, 1))
    cuda = rules == CUDA_OCCUPANCY
    limits = [hw.max_threads_per_unit // (warps * hw.warp_size if cuda else threads),
              MAX_BLOCKS_PER_UNIT]
    if res.registers_per_thread and cuda:
        per_warp = _align(res.registers_per_thread * hw.warp_size, CUDA_REGISTER_UNIT)
        limits.append(hw.registers_per_unit // per_warp // warps)
    elif res.registers_per_thread:
        limits.append(hw.registers_per_unit // (res.registers_per_thread * threads))
    if res.shared_bytes and cuda:
        per_block = _align(res.shared_bytes + CUDA_SHARED_RESERVED, CUDA_SHARED_UNIT)
        limits.append(hw.shared_memory_bytes_per_unit // per_block)
    elif res.shared_bytes:
        limits.append(hw.shared_memory_bytes_per_unit // res.shared_bytes)
    return max(min(limits), 1)


def waves_per_simd(res) -> int:
    """Waves of ``res``'s kernel one gfx90a SIMD holds by its VGPRs (AGPRs included)."""
    if not res.registers_per_thread:
        return CDNA_WAVES_PER_SIMD
    vgprs = _align(res.registers_per_thread, CDNA_VGPR_GRANULE)
    return max(min(CDNA_WAVES_PER_SIMD, CDNA_VGPRS // vgprs), 0)


def _cdna_blocks(hw, res) -> int:
    waves = -(-max(res.threads_per_block, 1) // hw.warp_size)  # waves per block
    per_cu = waves_per_simd(res) * CDNA_SIMDS  # waves the CU's register files hold
    limits = [per_cu // waves, hw.max_threads_per_unit // (waves * hw.warp_size)]
    if waves > 1:
        limits.append(CDNA_MAX_GROUPS)
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
