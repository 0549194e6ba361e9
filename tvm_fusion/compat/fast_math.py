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

Nothing changes when this module is imported. The rule is TVM's ``llvm.FLowerIntrinsic``
attribute of ``tirx.exp``, which is process-wide: :func:`vectorizable_exp` installs ours
when the first block (of any thread) opens and puts TVM's own back when the last one
closes, so a process that imports tvm_fusion next to other TVM code lowers ``exp`` as TVM
does outside tvm-fusion's builds. While it is installed, a build outside every block (in
another thread) still gets TVM's lowering from it.
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
_EXP_OP, _LOWERING_ATTR = "tirx.exp", "llvm.FLowerIntrinsic"
_LEVEL = 99  # above TVM's own rule (level 10)
_TVM_LEVEL = 10  # the level TVM registers its own rules at (C++ set_attr's default)
_install_lock = threading.Lock()
_installed = {"blocks": 0, "saved": None}  # open blocks of all threads; TVM's rule


def _lower_exp(call: tirx.Call) -> tirx.PrimExpr:
    """LLVM's lowering of ``exp`` while installed: :func:`fast_exp` inside a fast
    :func:`vectorizable_exp` of this thread, else what TVM's own rule gives (the
    ``llvm.exp`` intrinsic)."""
    dtype = str(call.ty.dtype)
    if _is_f32(dtype):
        _state.lowered = getattr(_state, "lowered", 0) + 1
        modes = getattr(_state, "modes", ())
        if modes and modes[-1]:
            return fast_exp(call.args[0])
    return tirx.call_llvm_pure_intrin(dtype, "llvm.exp", call.args[0])


def _install() -> None:
    with _install_lock:
        if _installed["blocks"] == 0:
            op = tvm.ir.Op.get(_EXP_OP)
            _installed["saved"] = op.get_attr(_LOWERING_ATTR)
            tirx.op.register_intrin_lowering(_EXP_OP, target="llvm", f=_lower_exp,
                                             level=_LEVEL)
        _installed["blocks"] += 1


def _uninstall() -> None:
    with _install_lock:
        _installed["blocks"] -= 1
        if _installed["blocks"] == 0:
            op = tvm.ir.Op.get(_EXP_OP)
            op.reset_attr(_LOWERING_ATTR)
            if _installed["saved"] is not None:  # TVM's own function object, as it was
                op.set_attr(_LOWERING_ATTR, _installed["saved"], _TVM_LEVEL)
            _installed["saved"] = None


@contextlib.contextmanager
def vectorizable_exp(fast: bool = True):
    """Builds inside this block lower float32 ``exp`` on LLVM targets as :func:`fast_exp`.

    Parameters
    ----------
    fast : bool, default True
        False: builds inside lower ``exp`` as TVM does (libm), but still counted by
        :func:`exp_lowerings`; the verifier's reference build uses it to learn whether
        its kernel has an exponential.

    Notes
    -----
    The mode is thread-local (the lowering runs in the thread that calls
    ``tvm.tirx.build`` or ``relax.build``; the innermost block decides); the rule is
    installed process-wide while any thread is inside a block (module docstring).
    """
    _install()
    _state.modes = (*getattr(_state, "modes", ()), bool(fast))
    try:
        yield
    finally:
        _state.modes = _state.modes[:-1]
        _uninstall()


def exp_lowerings() -> int:
    """How many float32 ``exp`` calls this thread's LLVM builds inside
    :func:`vectorizable_exp` (fast or not) have lowered so far: a build that moves it
    has an exponential."""
    return getattr(_state, "lowered", 0)
