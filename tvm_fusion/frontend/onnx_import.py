"""Import an ONNX model into Relax: fix input shapes, fold shape subgraphs, convert."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tvm
from google.protobuf.message import DecodeError

from tvm_fusion.errors import ModelImportError

from .consts import apply_consts
from .convert import check_supported, convert, struct_tensor_infos
from .external import load_external_data
from .fold import fix_input_shapes, fold_constants
from .rnn import expand_recurrent
from .rewrite import rewritten_for_import
from .unroll import unroll_loops
from .shapes import TensorInfo, graph_inputs, onnx_dtype_name, resolve_shapes

ModelSource = str | os.PathLike | onnx.ModelProto | bytes


@dataclass(frozen=True)
class ImportedModel:
    """A model imported into Relax, with what is needed to check it against ONNX Runtime.

    ``mod["main"]`` takes ``inputs`` in order and returns ``outputs`` in order (a tuple
    when there are several); weights are embedded as constants. ``onnx_model`` is the
    shape-fixed, folded ONNX model the module was converted from.

    After graph simplification (``tvm_fusion.import_model`` does it by default),
    ``simplified`` is its :class:`~tvm_fusion.simplify.SimplifyReport` and
    ``unsimplified`` the model as converted, so that logs tuned on the unsimplified graph
    can still be deployed; both are None for a model straight from the converter.
    """

    mod: tvm.IRModule
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    onnx_model: onnx.ModelProto
    model_hash: str
    source: str
    consts: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Inputs fixed as constants at import (no longer inputs of ``mod``)."""
    simplified: Any = None
    unsimplified: ImportedModel | None = None


def import_model(model: ModelSource, shapes: Mapping[str, Sequence[int]] | None = None,
                 *, name: str | None = None, consts: Mapping | None = None) -> ImportedModel:
    """Import an ONNX model into a static-shape Relax module.

    Parameters
    ----------
    model : str, os.PathLike, onnx.ModelProto or bytes
        A path to an ``.onnx`` file, a loaded model, or its serialized bytes.
    shapes : mapping of str to sequence of int, optional
        Static shapes of inputs, e.g. ``{"x": (1, 3, 224, 224)}``. Required for every
        input with a dynamic dim; inputs whose dims are all static may be left out.
    name : str, optional
        What to call the model in messages and in ``source``; defaults to the path.
    consts : mapping of str to array-like, optional
        Inputs to fix as constants, e.g. ``{"sr": 16000}``: each becomes a weight, so
        a top-level ``If`` on its value folds to the branch it takes (see
        :mod:`.consts`). They are no longer inputs of the module.

    Returns
    -------
    ImportedModel

    Raises
    ------
    ModelImportError
        A missing or non-ONNX file, a shape for a name that is not an input, or a
        failure inside TVM's converter (naming the node).
    MissingShapeError
        An input with dynamic dims has no shape.
    UnsupportedOpError
        The model uses op types TVM cannot convert; all of them are listed.
    """
    raw, proto, source = _load(model, name)
    proto, fixed_consts = apply_consts(proto, consts or {}, source)
    inputs = graph_inputs(proto)
    dtypes = {i.name: _input_dtype(i, source) for i in inputs}
    fixed = resolve_shapes(inputs, shapes, source)
    folded = unroll_loops(fold_constants(fix_input_shapes(proto, fixed)), fold_constants)
    unrolled = expand_recurrent(folded, source)  # LSTM/GRU/RNN: TVM has no converter
    if unrolled is not folded:
        folded = fold_constants(unrolled)
    check_supported(folded, source)
    with rewritten_for_import(folded) as for_importer:
        mod = convert(for_importer, fixed, dtypes, source)
    out_names = [o.name for o in folded.graph.output]
    return ImportedModel(
        mod=mod,
        inputs=tuple(TensorInfo(i.name, fixed[i.name], dtypes[i.name]) for i in inputs),
        outputs=struct_tensor_infos(mod["main"].ret_ty, out_names),
        onnx_model=folded,
        model_hash=model_hash(raw, [(i.name, fixed[i.name]) for i in inputs], fixed_consts),
        source=source,
        consts=fixed_consts,
    )


def model_hash(raw: bytes, shapes: Sequence[tuple[str, tuple[int, ...]]],
               consts: Mapping | None = None) -> str:
    """sha256 hex of the model bytes, the fixed input shapes (in input order) and the
    inputs fixed as constants, if any."""
    digest = hashlib.sha256(raw)
    digest.update(json.dumps([[n, list(s)] for n, s in shapes]).encode())
    if consts:
        digest.update(json.dumps({n: np.asarray(v).tolist() for n, v in sorted(consts.items())})
                      .encode())
    return digest.hexdigest()


def _input_dtype(info: onnx.ValueInfoProto, source: str) -> str:
    elem_type = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
    try:
        return onnx_dtype_name(elem_type)
    except (KeyError, ValueError, TypeError):
        raise ModelImportError(
            f"input {info.name!r} of {source} is not a numeric tensor (it is a "
            f"{info.type.WhichOneof('value') or 'untyped value'}, element type {elem_type}); "
            "only numeric tensor inputs can be imported"
        ) from None


def _load(model: ModelSource, name: str | None) -> tuple[bytes, onnx.ModelProto, str]:
    """The original bytes, a private parsed copy, and the name used in messages."""
    if isinstance(model, onnx.ModelProto):
        raw = model.SerializeToString()
        return raw, onnx.ModelProto.FromString(raw), name or model.graph.name or "<model>"
    if isinstance(model, (bytes, bytearray)):
        source = name or "<bytes>"
        return bytes(model), _parse(bytes(model), source), source
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        source = name or str(path)
        if not path.exists():
            raise ModelImportError(f"model file not found: {path} (expected an .onnx file)")
        if not path.is_file():
            raise ModelImportError(f"{path} is not a file (expected an .onnx file)")
        raw = path.read_bytes()
        proto = _parse(raw, str(path))
        # Models over 2 GB keep their weights next to the .onnx file.
        load_external_data(proto, path.parent, source)
        return raw, proto, source
    raise ModelImportError(
        "expected a path, onnx.ModelProto or bytes for the model, got "
        f"{type(model).__name__}")


def _parse(raw: bytes, source: str) -> onnx.ModelProto:
    try:
        proto = onnx.ModelProto.FromString(raw)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise ModelImportError(f"{source} is not an ONNX model (cannot parse it: {err})") from None
    # Arbitrary bytes sometimes parse as a protobuf; a real model has a version and outputs.
    if proto.ir_version < 1 or not proto.graph.output or not proto.opset_import:
        raise ModelImportError(
            f"{source} is not an ONNX model (no IR version, opset or graph outputs in it)")
    bad = next(_undecoded_text(proto), None)
    if bad is not None:  # protobuf hands such a field over as bytes, which nothing expects
        raise ModelImportError(f"{source} is damaged: its {bad} field holds bytes that are "
                               "not UTF-8 text; export the model again or copy it again")
    return proto


def _undecoded_text(msg) -> Iterator[str]:
    """The names of string fields of ``msg`` (recursively) that are not valid UTF-8."""
    if msg.DESCRIPTOR.full_name == "onnx.TensorProto":  # not its data: reading copies it
        if not isinstance(msg.name, str):
            yield "TensorProto.name"
        for entry in msg.external_data:
            yield from _undecoded_text(entry)
        return
    for fd, value in msg.ListFields():
        if fd.type == fd.TYPE_STRING:
            values = [value] if isinstance(value, (str, bytes)) else value
            if not all(isinstance(v, str) for v in values):
                yield fd.full_name.removeprefix("onnx.")
        elif fd.type == fd.TYPE_MESSAGE:
            for sub in [value] if hasattr(value, "ListFields") else value:
                yield from _undecoded_text(sub)
