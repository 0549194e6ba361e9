"""The cost model's feature schema: rows per buffer store of a scheduled candidate.

Like MetaSchedule's own XGBoost model, a candidate is a set of rows, one per buffer
store in its scheduled code, and its score is the sum of the model's outputs over its
rows. Each row joins three parts:

- **store**: MetaSchedule's per-store features (164, already log-scaled by MetaSchedule:
  arithmetic counts, memory access patterns per buffer, loop annotations such as
  parallel / vectorize / unroll extents, allocation sizes);
- **group**: the fused kernel itself, from its unscheduled PrimFunc: ops fused (blocks),
  reductions among them, FLOPs, bytes read and written through its parameters, bytes of
  its intermediates (what fusion keeps out of DRAM), arithmetic intensity;
- **hardware**: the HardwareTarget's numbers (log peak FLOP/s, DRAM bandwidth, caches,
  cores, vector width...), so one model can learn from several targets.

``FEATURE_VERSION`` changes whenever a column is added, dropped or reordered; a model
saved with another version refuses to load.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from ..family import strategy
from ..targets import HardwareTarget
from ..compat.fast_import import import_tensor_intrinsics

FEATURE_VERSION = 1
STORE_DIM = 164  # MetaSchedule's per-store-feature with its default arguments
GROUP_NAMES = ("ops", "reduction_ops", "log2_flops", "log2_param_bytes",
               "log2_output_bytes", "log2_intermediate_bytes", "log2_arith_intensity",
               "params")
HW_NAMES = ("is_gpu", "log2_peak_fp32_flops", "log2_dram_gbs", "compute_units",
            "clock_ghz", "log2_l1_bytes", "log2_l2_bytes", "log2_llc_bytes",
            "log2_shared_bytes", "vector_width_bits", "warp_size", "registers_per_unit",
            "log2_ridge_flop_per_byte")
# the columns a calibration moves for the same machine (targets.CALIBRATED_FIELDS)
CALIBRATED_HW_NAMES = ("log2_peak_fp32_flops", "log2_dram_gbs", "clock_ghz",
                       "log2_ridge_flop_per_byte")


def feature_names() -> list[str]:
    """Column names of a store row, in order."""
    return [*(f"store_{i}" for i in range(STORE_DIM)), *(f"group_{n}" for n in GROUP_NAMES),
            *(f"hw_{n}" for n in HW_NAMES)]


def _log2(x: float) -> float:
    return math.log2(1.0 + max(float(x), 0.0))


def hardware_features(hw: HardwareTarget) -> np.ndarray:
    """The hardware descriptor of ``hw`` (columns ``HW_NAMES``)."""
    peak = hw.peak_fp32_flops
    bw = hw.dram_bandwidth_gbs * 1e9
    return np.array([
        float(strategy(hw).is_gpu), _log2(peak), _log2(hw.dram_bandwidth_gbs),
        hw.compute_units, hw.clock_ghz, _log2(hw.l1_bytes_per_unit),
        _log2(hw.l2_bytes_per_unit), _log2(hw.llc_bytes),
        _log2(hw.shared_memory_bytes_per_unit), hw.vector_width_bits, hw.warp_size,
        hw.registers_per_unit, _log2(peak / bw if bw else 0.0)], dtype=np.float32)


def _nbytes(buf) -> int:
    n = 1
    for d in buf.shape:
        n *= int(d)
    return n * tvm.DataType(str(buf.dtype)).bits // 8


def group_features(mod: tvm.IRModule) -> np.ndarray:
    """Features of the fused kernel ``mod["main"]`` before scheduling (``GROUP_NAMES``)."""
    func = mod["main"]
    sch = tvm.s_tir.Schedule(mod)
    root = sch.get_sblock("root")
    blocks = [sch.get(b) for b in sch.get_child_blocks(root)]
    # IterVar.iter_type 2 = CommReduce: a block with one is a reduction op
    reductions = sum(any(int(iv.iter_type) == 2 for iv in b.iter_vars) for b in blocks)
    try:
        flops = float(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:  # estimation is best effort on exotic kernels; 0 marks "unknown"
        flops = 0.0
    params = [_nbytes(b) for b in func.params]
    inter = sum(_nbytes(b) for b in sch.get(root).alloc_buffers)
    io = sum(params)
    return np.array([len(blocks), reductions, _log2(flops), _log2(io),
                     _log2(params[-1] if params else 0), _log2(inter),
                     _log2(flops / io if io else 0.0), len(params)], dtype=np.float32)


class FeatureBuilder:
    """Turns scheduled candidates of one hardware target into feature rows.

    Group features are cached per workload (structural hash), so a tuning run pays for
    them once per kernel.
    """

    def __init__(self, hw: HardwareTarget):
        self.hw = hw
        self.hw_row = hardware_features(hw)
        self._extractor = ms.FeatureExtractor.create("per-store-feature")
        self._groups: dict[int, np.ndarray] = {}
        self._target = hw.tvm_target()

    def group_row(self, mod: tvm.IRModule) -> np.ndarray:
        """Cached :func:`group_features` of ``mod``."""
        key = tvm_ffi.structural_hash(mod)
        if key not in self._groups:
            self._groups[key] = group_features(mod)
        return self._groups[key]

    def rows(self, mod: tvm.IRModule, candidates: list, context=None) -> list[np.ndarray]:
        """Store rows of each candidate of workload ``mod`` (one array per candidate).

        ``context`` is the MetaSchedule TuneContext when called from a search; without
        one a minimal context for this target is made.
        """
        if not candidates:
            return []
        if context is None:
            # a TuneContext imports TVM's tensor intrinsics the slow way (25 s) on first use
            import_tensor_intrinsics()
            context = ms.TuneContext(mod=mod, target=self._target)
        per_store = self._extractor.extract_from(context, candidates)
        tail = np.concatenate([self.group_row(mod), self.hw_row])
        out = []
        for f in per_store:
            f = f.numpy().astype(np.float32).reshape(-1, STORE_DIM)
            out.append(np.concatenate([f, np.broadcast_to(tail, (len(f), len(tail)))], 1))
        return out
