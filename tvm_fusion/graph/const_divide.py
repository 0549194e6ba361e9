"""float32 division by a constant as a multiplication by its reciprocal.

A vector divide costs 10-20x a multiply on x86 (``vdivps`` zmm: one per ~10 cycles
against two multiplies per cycle), and a QDQ conv's epilogue divides twice per element
by constants after import: batch norm's ``/ sqrt(var + eps)`` (left between a dequantize
and a quantize, so not folded into the conv) and HardSwish's ``/ 6``. ONNX Runtime
multiplies in both places (its BatchNormalization by a precomputed inverse deviation,
MLAS's HardSwish by ``1/6``). The product differs from the quotient by at most one ulp
(none for a power of two), far inside the tolerance outputs are checked at. The
quantize's own ``x / scale`` is ``relax.quantize``, not a ``divide``, and keeps dividing,
so its rounding on ``.5`` boundaries stays ONNX's. The PrimFunc keeps the name
``divide``, so the planner's BN and HardSwish patterns still read it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, topi
from tvm.relax.transform.legalize_ops.binary import _binary
from tvm.relax.transform.legalize_ops.common import _try_convert_to_scalar_const

_stock = _binary(topi.divide)


def _divide(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    x, d = call.args
    if not (isinstance(d, tvm.ir.GenericConst) and isinstance(d.value, tvm.runtime.Tensor)
            and str(d.value.dtype) == "float32" and isinstance(x.ty, relax.TensorType)
            and str(x.ty.dtype) == "float32"):
        return _stock(bb, call)
    value = d.value.numpy()
    with np.errstate(divide="ignore", over="ignore"):
        recip = (np.float32(1) / value).astype(np.float32)
    if not (np.all(np.isfinite(value)) and np.all(value != 0) and np.all(np.isfinite(recip))):
        return _stock(bb, call)
    # a scalar becomes an immediate, as the stock legalization does for the divisor
    factor = _try_convert_to_scalar_const(relax.const(recip, "float32"))
    return bb.call_te(topi.multiply, x, factor, primfunc_name_hint="divide")


LEGALIZE_MAP = {"relax.divide": _divide}
"""Overrides for ``relax.transform.LegalizeOps(customize_legalize_map=...)``."""
