"""``--precision fp16``: Relax's mixed-precision conversion, before planning.

``relax.transform.ToMixedPrecision`` casts the operands of matmuls and convolutions to
fp16 and keeps an fp32 accumulator (``out_dtype="float32"``), so the contractions become
tensor-core work on A100/H100 (dlight's WMMA path and MetaSchedule's tensor-core rules
pick fp16 operands), while the model's inputs and outputs keep their dtypes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..errors import TvmFusionError

PRECISIONS = ("fp32", "fp16")


def apply_precision(model, precision: str = "fp32"):
    """Return ``model`` converted to ``precision`` (``fp32``: unchanged).

    Parameters
    ----------
    model : ImportedModel
    precision : str
        ``fp32`` or ``fp16`` (fp16 operands, fp32 accumulation).

    Returns
    -------
    ImportedModel
        For fp16: the converted module, a distinct ``model_hash`` (its tuning records
        are not the fp32 model's) and ``source`` marked ``[fp16]``.
    """
    if precision not in PRECISIONS:
        raise TvmFusionError(f"unknown precision {precision!r}; expected one of "
                             f"{', '.join(PRECISIONS)}")
    if precision == "fp32":
        return model
    try:
        mod = relax.transform.ToMixedPrecision(out_dtype="float32")(_bounds_as_tensor_ops(
            model.mod))
    except RuntimeError as err:  # TVM's errors (tvm.error.InternalError ...) are these
        last = str(err).strip().splitlines()[-1]
        raise TvmFusionError(f"--precision fp16: Relax's ToMixedPrecision cannot convert "
                             f"{model.source} ({last}); build it with --precision fp32")
    digest = hashlib.sha256(f"{model.model_hash}:fp16-mixed".encode()).hexdigest()
    return dataclasses.replace(model, mod=mod, model_hash=digest,
                               source=f"{model.source} [fp16]")


def _bounds_as_tensor_ops(mod):
    """Clip as ``minimum(maximum(x, lo), hi)``, with Relax ops and tensor bounds.

    TVM 0.27's ToMixedPrecision stops on a call argument that is not a tensor. The ONNX
    importer writes Clip either as ``R.clip`` with scalar ``PrimExpr`` bounds ("Expected
    TensorType, but got T.int64": every CNN with a ReLU6 or a hard sigmoid) or, when the
    bounds are inputs, as ``call_tir`` of TOPI's ``maximum`` / ``minimum`` (the callee is
    an ``R.Callable``). Both become Relax's ``maximum`` / ``minimum``: the same values,
    still elementwise, so the plan's groups do not change.
    """
    found = [0]

    def clip(expr, m):
        # the bounds come as tir.IntImm / FloatImm (or a PrimValue holding one)
        bounds = [getattr(expr.args[i], "value", None) for i in (1, 2)]
        bounds = [getattr(b, "value", b) for b in bounds]
        if not all(isinstance(b, (int, float)) for b in bounds):
            return expr
        dtype = str(expr.ty.dtype)
        found[0] += 1
        low, high = (relax.const(float(b), dtype) for b in bounds)
        return relax.op.minimum(relax.op.maximum(expr.args[0], low), high)

    def topi_call(expr, m):
        callee, args = expr.args[0], expr.args[1]
        op = re.fullmatch(r"(maximum|minimum)_?\d*", getattr(callee, "name_hint", ""))
        fields = getattr(args, "fields", ())
        if op is None or len(fields) != 2 or len(expr.args) != 2:
            return expr
        # TOPI's kernel: one block of T.max / T.min (not a user's function of that name)
        body = mod[callee].script()
        if ("T.max(" if op.group(1) == "maximum" else "T.min(") not in body:
            return expr
        found[0] += 1
        return getattr(relax.op, op.group(1))(*fields)

    main = mod["main"]
    main = rewrite_call(is_op("relax.clip")(wildcard(), wildcard(), wildcard()), clip, main)
    main = rewrite_call(is_op("relax.call_tir")(wildcard(), wildcard()), topi_call, main)
    if not found[0]:
        return mod
    out = mod.clone() if hasattr(mod, "clone") else type(mod)(mod.functions, attrs=mod.attrs)
    out["main"] = main
    # TOPI's maximum / minimum PrimFuncs have no caller left
    return relax.transform.DeadCodeElimination(["main"])(out)
