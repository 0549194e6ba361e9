"""Float32 ``exp`` on CPUs as a polynomial the vectorizer takes, applied when a kernel is built.

TVM lowers ``T.exp`` on LLVM targets to the ``llvm.exp`` intrinsic, and without a vector
math library LLVM expands that into one libm ``expf`` call per lane, so no schedule
vectorizes an exponential: MiniLM-L3's attention softmax (12 x 128 x 128) was 366 us per
call after 32 trials, PP-OCRv4 rec's 40 x 6625 one 715 us. ONNX Runtime computes its
exponentials with a vectorized polynomial (MLAS ``MlasComputeExp``).
Inside :func:`vectorizable_exp`, LLVM builds lower every float32 ``exp`` as
``topi.fast_exp``'s formula (range reduction by ``ln 2``, Cephes' degree-7 polynomial,
the exponent put in by bit shift), with the reduction in two parts of ``ln 2`` as Cephes
does it: plain arithmetic that vectorizes, within 8e-8 of float64 ``exp`` from -87.3 to
88.37 (numpy's float32 ``exp``: 1.9e-7). From 88.38 it gives inf, where float32's own
overflows at 88.72 (tests/test_fast_math.py).

It is a lowering rule (TVM's ``LowerIntrin``), so it acts when a kernel is built, never
on what the planner or the tuner sees: the kernels' FLOP counts, design spaces and
workload hashes (the keys of tuning logs) are unchanged, and logs tuned before it still
apply. Every build of a kernel that
is timed or deployed takes it (the tuner's builder, the verifier's default and
candidates, ``compile``, offline bundles); the verifier's reference keeps libm ``exp``,
so the approximation is checked against it. GPU targets keep their own ``exp``.
"""

from __future__ import annotations

import contextlib
import threading

import tvm
from tvm import tirx

_HI, _LO = 88.3762626647950, -88.3762626647949
_LOG2E = 1.44269504088896341
# ln 2 in two parts (Cody and Waite): n * _LN2_HI is exact in float32 for |n| < 2**15,
# so the reduced argument keeps float32's precision up to |x| = 88 (one float32 ln 2
# loses 4e-6 relative there)
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
         1.6666665459e-1, 5.0000001201e-1)


def fast_exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``topi.fast_exp``'s formula on a float32 expression (scalar or vector).

    ``exp(x) = 2**n * exp(f)`` with ``n = floor(x log2 e + 1/2)``, ``f = x - n ln 2``
    (``ln 2`` in two parts, where topi uses one and loses 4e-6 near the ends),
    ``exp(f)`` by its degree-7 polynomial and ``2**n`` built in the exponent bits;
    ``x`` is clamped to +-88.38 (float32's range), and the result is at least ``x`` as
    in topi (``exp(-inf)`` is 0, ``exp(inf)`` stays inf).
    """
    dtype = str(x.ty.dtype)
    lanes = tvm.DataType(dtype).lanes
    itype = "int32" if lanes == 1 else f"int32x{lanes}"

    def c(v, scalar="float32"):
        k = tirx.const(v, scalar)
        return k if lanes == 1 else tirx.Broadcast(k, lanes)

    xv = tirx.Var("exp_x", dtype)
    cl = tirx.Var("exp_clamped", dtype)
    n = tirx.Var("exp_n", dtype)
    f = tirx.Var("exp_f", dtype)
    p = c(_POLY[0])
    for k in _POLY[1:]:
        p = p * f + c(k)
    y = p * f * f + f + c(1.0)
    two_n = tirx.reinterpret(dtype, tirx.Cast(itype, n + c(127.0)) << c(23, "int32"))
    body = tirx.Max(two_n * y, xv)
    body = tirx.Let(f, (cl - n * c(_LN2_HI)) - n * c(_LN2_LO), body)
    body = tirx.Let(n, tirx.floor(cl * c(_LOG2E) + c(0.5)), body)
    body = tirx.Let(cl, tirx.Max(tirx.Min(xv, c(_HI)), c(_LO)), body)
    return tirx.Let(xv, x, body)


def _is_f32(dtype) -> bool:
    dt = tvm.DataType(str(dtype))
    return dt.type_code == tvm.DataTypeCode.FLOAT and dt.bits == 32


_state = threading.local()


def _lower_exp(call: tirx.Call) -> tirx.PrimExpr:
    """LLVM's lowering of ``exp``: :func:`fast_exp` inside :func:`vectorizable_exp`,
    else what TVM's own rule gives (the ``llvm.exp`` intrinsic)."""
    dtype = str(call.ty.dtype)
    if _is_f32(dtype):
        _state.lowered = getattr(_state, "lowered", 0) + 1
        if getattr(_state, "depth", 0):
            return fast_exp(call.args[0])
    return tirx.call_llvm_pure_intrin(dtype, "llvm.exp", call.args[0])


# One rule above TVM's (level 10), registered once per process; outside
# vectorizable_exp it lowers exactly as TVM does, so other builds in the process keep
# libm's exp.
tirx.op.register_intrin_lowering("tirx.exp", target="llvm", f=_lower_exp, level=99)


@contextlib.contextmanager
def vectorizable_exp():
    """Builds inside this block lower float32 ``exp`` on LLVM targets as :func:`fast_exp`.

    Thread-local: the lowering runs in the thread that calls ``tvm.tirx.build`` or
    ``relax.build``.
    """
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def exp_lowerings() -> int:
    """How many float32 ``exp`` calls this thread's LLVM builds have lowered so far
    (either way): a build that moves it has an exponential."""
    return getattr(_state, "lowered", 0)
