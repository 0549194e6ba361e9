"""A float32 matmul by a wide constant whose columns are not a multiple of 16, padded.

MLAS packs every constant GEMM operand into 16-column panels, the last one zero-filled
(``MlasGemmPackB``), so its register tile never has a ragged edge. TVM's legalization
keeps the model's column count, and a classifier head such as PP-OCR rec's CTC projection
(120 -> 6625 = 5^3 x 53 classes) then has no vector-multiple tile: tvm-fusion's register
tile (schedules/cpu_rules.py) requires the columns to divide into vectors and the SSRSRS
spaces split 6625 into factors of 5 and 53, so the kernel ran at 1051 us against ONNX
Runtime's 370 (benchmarks/RESULTS.md, run 8's kernel table).

Here the constant is padded with zero columns up to a multiple of :data:`COLUMN_BLOCK` at
legalization (once, a constant: prepacking then folds it into the packed panels), the
product is computed over the padded columns, and the same PrimFunc copies out the model's
columns (a second block, which the tile computes as its epilogue). The zero columns add
no term to the kept ones, so the result is the unpadded product exactly. 16 fp32 lanes is
AVX-512's vector; it is a multiple of AVX2's 8 and of a GPU warp's tiles, so the padding
is target independent.

Narrower constants (under :data:`MIN_COLUMNS`) keep TVM's legalization and their kernels'
workload hashes, which tuning logs are keyed by; so do dynamic shapes, integer and mixed
dtypes, and a constant on the left.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.relax.transform.legalize_ops import linear_algebra as stock

COLUMN_BLOCK = 16
"""Columns are padded up to a multiple of this (AVX-512's fp32 lanes)."""

MIN_COLUMNS = 512
"""Constants with fewer columns keep TVM's legalization."""


def _static(ty) -> tuple[int, ...] | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def padded_columns(call: relax.Call) -> int | None:
    """The padded column count of a matmul this module rewrites, else None."""
    x, w = call.args
    out_dtype = call.attrs.out_dtype
    if not (isinstance(w, tvm.ir.GenericConst) and isinstance(w.value, tvm.runtime.Tensor)
            and str(w.value.dtype) == "float32"
            and isinstance(x.ty, relax.TensorType) and str(x.ty.dtype) == "float32"
            and (not out_dtype or str(out_dtype) == "float32")):
        return None
    xs, ws = _static(x.ty), tuple(w.value.shape)
    if xs is None or len(xs) < 2 or len(ws) != 2 or xs[-1] != ws[0]:
        return None
    n = ws[1]
    if n < MIN_COLUMNS or n % COLUMN_BLOCK == 0:
        return None
    return -(-n // COLUMN_BLOCK) * COLUMN_BLOCK


def _matmul(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    padded = padded_columns(call)
    if padded is None:
        return stock._matmul(bb, call)
    x, w = call.args
    weight = w.value.numpy()
    k, n = weight.shape
    wide = np.zeros((k, padded), np.float32)
    wide[:, :n] = weight
    lead = _static(x.ty)[:-1]

    def compute(a: te.Tensor, b: te.Tensor) -> te.Tensor:
        r = te.reduce_axis((0, k), name="k")
        full = te.compute(lead + (padded,),
                          lambda *i: te.sum(a[i[:-1] + (r,)] * b[r, i[-1]], axis=r),
                          name="matmul")
        return te.compute(lead + (n,), lambda *i: full[i], name="T_strided_slice")

    return bb.call_te(compute, x, relax.const(wide), primfunc_name_hint="matmul")


LEGALIZE_MAP = {"relax.matmul": _matmul}
"""Overrides for ``relax.transform.LegalizeOps(customize_legalize_map=...)``."""
