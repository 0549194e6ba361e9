"""Which instruction runs an int8 GEMM on a target, and at what rate it is priced.

An integer GEMM (``u8 x s8 -> i32``, see :mod:`tvm_fusion.simplify.qdq`) is priced at the
target's int8 peak of the unit TVM can reach there, and its group's reason names that
instruction:

- x86 with ``avx512_vnni`` / ``avx_vnni``: VNNI ``vpdpbusd`` (``int8_vector``; MetaSchedule's
  ``dot_16x4_vnni`` / ``dot_32x4_avx512`` intrinsics); without VNNI, ``vpmaddubsw`` +
  ``vpmaddwd``, priced at the fp32 rate (no int8 peak in the file);
- NVIDIA: IMMA (int8 ``mma.sync``, ``int8_matrix``) where the target has int8 Tensor
  Cores, else DP4A (``int8_vector``);
- AMD CDNA: ``v_dot4_i32_i8`` (dot4, ``int8_vector``): TVM's ROCm intrinsic is ``sdot4``;
  it has no int8 MFMA intrinsic, so the matrix-core peak is not what a TVM kernel gets.
"""

from __future__ import annotations

from ..family import strategy

_INT8 = ("int8", "uint8")
VNNI_CONV = "conv2d_NCHWc_int8"  # graph/int8_conv.py: the blocked conv VNNI reads
FALLBACK_NOTE = ("int8 conv not in VNNI's blocked form (depthwise, grouped, NCHW or "
                 "channels not in blocks of 16): int32 vector loops (a depthwise conv "
                 "holds 16 channels in lanes), priced at the fp32 rate")


def is_int8(dtype: str) -> bool:
    """Whether a GEMM operand dtype is an 8-bit integer."""
    return str(dtype) in _INT8


def reaches_int8_unit(hw, op: str) -> bool:
    """Whether an int8 contraction (PrimFunc ``op``) can run on :func:`int8_unit` of
    ``hw``. On CPUs a conv does only in the blocked form of :data:`VNNI_CONV` (16 output
    lanes x 4 input channels); any other int8 conv is integer loops (``vpmulld``, no
    ``vpdpbusd``), so pricing it at the VNNI rate would let an NCHW plan of a QDQ CNN
    look 10x faster than it runs."""
    return not strategy(hw).int8_conv_needs_blocking or not op.startswith("conv2d") \
        or op.startswith(VNNI_CONV)


def int8_unit(hw) -> tuple[str, str]:
    """``(peak_flops key, instruction)`` an int8 GEMM runs on; key ``""`` when the target
    has no int8 peak (it is then priced at ``fp32_vector``)."""
    return strategy(hw).int8_unit(hw.peak_flops, hw.features)


def int8_peak(hw) -> float:
    """OP/s of :func:`int8_unit` (``fp32_vector`` when the target has no int8 peak)."""
    key, _ = int8_unit(hw)
    return hw.peak_flops[key] if key else hw.peak_fp32_flops


def int8_note(hw) -> str:
    """The reason's clause for a group with an int8 GEMM."""
    key, instr = int8_unit(hw)
    rate = int8_peak(hw) / 1e12
    return f"int8 GEMM priced on {instr}, {rate:.4g} TOP/s ({key or 'fp32_vector'})"
