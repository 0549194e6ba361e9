"""Model input descriptions and the user's fixed input shapes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from tvm_fusion.errors import MissingShapeError, ModelImportError

SHAPE_SYNTAX = "--shape NAME=D1,D2,..."


@dataclass(frozen=True)
class TensorInfo:
    """Name, static shape and numpy dtype name of a model input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse one ``--shape`` argument.

    Parameters
    ----------
    text : str
        ``NAME=D1,D2,...``, e.g. ``"x=1,3,224,224"``; ``"NAME="`` is a scalar.

    Returns
    -------
    tuple of (str, tuple of int)
        The input name and its dims.

    Raises
    ------
    ModelImportError
        If ``text`` does not follow the syntax; the message shows it.
    """
    name, sep, dims_text = text.strip().rpartition("=")
    name = name.strip()
    try:
        if not sep or not name:
            raise ValueError
        dims = tuple(int(d) for d in dims_text.split(",")) if dims_text.strip() else ()
        if any(d < 1 for d in dims):
            raise ValueError
    except ValueError:
        raise ModelImportError(
            f"bad shape {text!r}: expected {SHAPE_SYNTAX} with positive integer dims, "
            f"e.g. --shape x=1,3,224,224") from None
    return name, dims


def onnx_dtype_name(elem_type: int) -> str:
    """The numpy dtype name of an ONNX tensor element type."""
    return helper.tensor_dtype_to_np_dtype(elem_type).name


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs of a model: graph inputs that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def file_dims(info: onnx.ValueInfoProto) -> tuple[int | str, ...] | None:
    """Dims as written in the file: ints, symbolic names, or "?"; None for unknown rank."""
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple(
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0
        else (d.dim_param or "?") for d in tensor_type.shape.dim)


def resolve_shapes(inputs: Sequence[onnx.ValueInfoProto],
                   shapes: Mapping[str, Sequence[int]] | None,
                   source: str) -> dict[str, tuple[int, ...]]:
    """A static shape for every input: the given one, or the file's when all static.

    Raises
    ------
    ModelImportError
        For a shape given for a name that is not an input, or one that contradicts the
        file's rank or static dims.
    MissingShapeError
        For inputs with dynamic dims and no given shape; lists all of them.
    """
    given = {str(k): _checked_dims(k, v) for k, v in (shapes or {}).items()}
    by_name = {i.name: i for i in inputs}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise ModelImportError(
            f"shape given for {', '.join(map(repr, unknown))}, which is not an input of "
            f"{source}. The inputs are:\n{_describe(inputs)}")
    resolved, missing = {}, []
    for info in inputs:
        dims = file_dims(info)
        if info.name in given:
            resolved[info.name] = _agree(info.name, dims, given[info.name], source)
        elif dims is not None and all(isinstance(d, int) for d in dims):
            resolved[info.name] = tuple(dims)
        else:
            missing.append(info)
    if missing:
        raise MissingShapeError(_missing_message(missing, source))
    return resolved


def _checked_dims(name: object, dims: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(int(d) for d in dims)
        if any(d < 1 or d != float(orig) for d, orig in zip(out, dims)):
            raise ValueError
    except (TypeError, ValueError):
        raise ModelImportError(
            f"shape for {name!r} must be a sequence of positive ints, got {dims!r}") from None
    return out


def _agree(name: str, dims, shape: tuple[int, ...], source: str) -> tuple[int, ...]:
    if dims is None:
        return shape
    clash = len(dims) != len(shape) or any(
        isinstance(d, int) and d != s for d, s in zip(dims, shape))
    if clash:
        raise ModelImportError(
            f"shape {shape} given for input {name!r} does not fit its dims {_fmt(dims)} in "
            f"{source}: give {len(dims)} dims and keep the static ones as they are")
    return shape


def _missing_message(missing: Sequence[onnx.ValueInfoProto], source: str) -> str:
    lines = [f"{source} has inputs with dynamic dims and no shape was given for them:"]
    for info in missing:
        dims = file_dims(info)
        if dims is None:
            lines.append(f"  {info.name}: unknown rank  ->  --shape {info.name}=D1,D2,...")
            continue
        # Static dims stay as they are; each dynamic one becomes a placeholder to replace.
        flag = ",".join(str(d) if isinstance(d, int) else f"D{k + 1}" for k, d in enumerate(dims))
        lines.append(f"  {info.name}: dims {_fmt(dims)}  ->  --shape {info.name}={flag}")
    lines += [
        f"Give each a static shape with {SHAPE_SYNTAX} (positive integer dims, one flag "
        "per input),",
        'or in Python: import_model(..., shapes={"x": (1, 3, 224, 224)}).',
    ]
    return "\n".join(lines)


def _describe(inputs: Sequence[onnx.ValueInfoProto]) -> str:
    rows = []
    for info in inputs:
        dims = file_dims(info)
        dtype = onnx_dtype_name(info.type.tensor_type.elem_type) \
            if info.type.HasField("tensor_type") else "non-tensor"
        rows.append(f"  {info.name}: {_fmt(dims) if dims is not None else 'unknown rank'} {dtype}")
    return "\n".join(rows)


def _fmt(dims) -> str:
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"
