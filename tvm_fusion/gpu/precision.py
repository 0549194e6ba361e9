"""``--precision fp16``: Relax's mixed-precision conversion, before planning.

``relax.transform.ToMixedPrecision`` casts the operands of matmuls and convolutions to
fp16 and keeps an fp32 accumulator (``out_dtype="float32"``), so the contractions become
tensor-core work on A100/H100 (dlight's WMMA path and MetaSchedule's tensor-core rules
pick fp16 operands), while the model's inputs and outputs keep their dtypes.
"""

from __future__ import annotations

import dataclasses
import hashlib

from tvm import relax

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
    mod = relax.transform.ToMixedPrecision(out_dtype="float32")(model.mod)
    digest = hashlib.sha256(f"{model.model_hash}:fp16-mixed".encode()).hexdigest()
    return dataclasses.replace(model, mod=mod, model_hash=digest,
                               source=f"{model.source} [fp16]")
