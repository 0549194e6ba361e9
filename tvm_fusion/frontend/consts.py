"""Fix model inputs as constants (``--const NAME=VALUE``, ``import_model(consts=...)``).

A model that branches on an input's value (silero-vad's ``sr``: a top-level ``If`` picks
the 16 kHz or the 8 kHz network) has no single dataflow graph to plan. With that input
fixed, it becomes an initializer, the condition folds to a constant, and
:func:`~tvm_fusion.frontend.fold.fold_constants` replaces the ``If`` by the nodes of the
branch it takes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from tvm_fusion.errors import ModelImportError

from .shapes import graph_inputs, onnx_dtype_name

CONST_SYNTAX = "NAME=VALUE or NAME=V1,V2,..."


def parse_const(text: str) -> tuple[str, list[float]]:
    """Parse one ``--const`` argument: ``"sr=16000"`` -> ``("sr", [16000])``.

    Raises
    ------
    ModelImportError
        If ``text`` does not follow ``NAME=VALUE`` (numbers, comma-separated).
    """
    name, sep, value = text.strip().partition("=")
    name = name.strip()
    try:
        if not sep or not name or not value.strip():
            raise ValueError
        values = [float(v) for v in value.split(",")]
    except ValueError:
        raise ModelImportError(f"bad constant {text!r}: expected {CONST_SYNTAX} with numbers, "
                               "e.g. --const sr=16000") from None
    return name, values


def apply_consts(model: onnx.ModelProto, consts: Mapping, source: str
                 ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy of ``model`` whose inputs named in ``consts`` are initializers.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    consts : mapping of str to array-like
        A value for each input to fix; it takes the input's dtype, and the input's shape
        when that is static (a scalar input takes one number).
    source : str
        The model's name in messages.

    Returns
    -------
    (onnx.ModelProto, dict of str to numpy.ndarray)
        The model and the values as fixed.

    Raises
    ------
    ModelImportError
        A name that is not an input, or a value that does not fit the input's shape.
    """
    inputs = {i.name: i for i in graph_inputs(model)}
    unknown = [n for n in consts if n not in inputs]
    if unknown:
        raise ModelImportError(
            f"--const {unknown[0]}: {source} has no input {unknown[0]!r}; its inputs are "
            f"{', '.join(repr(n) for n in inputs)}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    fixed: dict[str, np.ndarray] = {}
    for name, value in consts.items():
        info = inputs[name]
        dtype = onnx_dtype_name(info.type.tensor_type.elem_type)
        dims = [d.dim_value if d.HasField("dim_value") else -1
                for d in info.type.tensor_type.shape.dim]
        array = np.asarray(value, dtype=dtype)
        if -1 not in dims and array.size == int(np.prod(dims, dtype=np.int64)):
            array = array.reshape(dims)
        elif array.ndim != len(dims) or any(d not in (-1, s) for d, s in zip(dims, array.shape)):
            shown = "x".join("?" if d < 0 else str(d) for d in dims) or "a scalar"
            raise ModelImportError(
                f"--const {name}: input {name!r} of {source} is {shown}, the value has "
                f"{array.size} element(s) of shape {array.shape}; give one number per element")
        fixed[name] = array
        out.graph.initializer.append(numpy_helper.from_array(array, name))
    kept = [i for i in out.graph.input if i.name not in fixed]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    return out, fixed
