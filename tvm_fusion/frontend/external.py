"""Read the external weights of an ONNX model (models over 2 GB keep them in files
beside the ``.onnx``), from inside the model's folder only.

A model file is untrusted input: a tensor's ``location`` can name ``../../secret``, an
absolute path, or a link in the folder that points elsewhere, and its ``offset`` and
``length`` can run past the end of the file. Every location is checked (links resolved,
compared with the resolved folder, offset and length against the file's size) before
any data file is opened, so nothing outside the folder is ever read; a bad one is a
:class:`~tvm_fusion.errors.ModelImportError` naming the tensor and the path.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

from tvm_fusion.errors import ModelImportError

FIX = ("keep the weights files inside the model's folder and name them relative to it "
       "(onnx.save(model, path, save_as_external_data=True) writes them so)")


@dataclass(frozen=True)
class _Slice:
    """Where one tensor's bytes are: a checked file inside the folder, offset, length."""

    tensor: TensorProto
    path: Path
    offset: int
    length: int


def load_external_data(model: onnx.ModelProto, folder: str | os.PathLike,
                       source: str) -> None:
    """Read every external tensor of ``model`` from files in ``folder``, in place.

    Parameters
    ----------
    model : onnx.ModelProto
        Its external tensors get their bytes as ``raw_data`` and lose their
        ``external_data`` entries (as ``onnx.load`` does).
    folder : str or os.PathLike
        The model's folder; locations are relative to it and must stay inside it.
    source : str
        The model's name in messages.

    Raises
    ------
    ModelImportError
        A location outside the folder (``..``, absolute, or a link leading out), a data
        file that is missing or not a regular file, an offset or length that is not a
        whole number or runs past the end of the file, or a size that does not fit the
        tensor's shape. Nothing is read unless every tensor passes.
    """
    tensors = [t for t in _all_tensors(model) if t.data_location == TensorProto.EXTERNAL]
    if not tensors:
        return
    root = Path(folder).resolve()
    slices = [_check(t, root, source) for t in tensors]  # all checked before any read
    for s in slices:
        s.tensor.raw_data = _read(s, source)
        s.tensor.data_location = TensorProto.DEFAULT
        del s.tensor.external_data[:]


def _all_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Initializers and tensor attributes of the graph, its subgraphs and functions."""
    yield from _graph_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for g in attr.graphs:
            yield from _graph_tensors(g)


def _check(tensor: TensorProto, root: Path, source: str) -> _Slice:
    """The checked place of ``tensor``'s bytes; opens nothing."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    where = f"{source}: tensor {tensor.name!r} keeps its data in {location!r}"
    if not location:
        raise ModelImportError(f"{source}: tensor {tensor.name!r} is marked as external data "
                               f"but names no file (no 'location'); {FIX}")
    if os.path.isabs(location):
        raise ModelImportError(f"{where}, an absolute path; {FIX}")
    try:
        path = (root / location).resolve()
    except ValueError:  # a NUL byte in the name
        raise ModelImportError(f"{where}, which is not a file name; {FIX}") from None
    except RuntimeError:  # Python 3.11's resolve() on links that lead to each other
        raise ModelImportError(f"{where}, a loop of links; {FIX}") from None
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise ModelImportError(f"{where}, which cannot be read ({err.strerror}); {FIX}"
                               ) from None
    if not path.is_relative_to(root):
        # inside by its name but not once links are followed: say where the link leads
        lexical = Path(os.path.normpath(root / location))
        link = f", a link to {path}" if lexical.is_relative_to(root) else ""
        raise ModelImportError(f"{where}{link}, outside the model's folder {root}; {FIX}")
    if st is None:
        raise ModelImportError(f"{where}, which does not exist in {root}; copy the data file "
                               "there (it is written beside the model when it is saved)")
    if not stat.S_ISREG(st.st_mode):
        raise ModelImportError(f"{where}, which is not a regular file; {FIX}")
    offset, length = _span(tensor, info, where, st.st_size)
    return _Slice(tensor, path, offset, length)


def _span(tensor: TensorProto, info: dict, where: str, size: int) -> tuple[int, int]:
    """The checked (offset, length) of the tensor's bytes in a file of ``size`` bytes."""
    offset = _whole(info.get("offset", "0"), "offset", where)
    length = _whole(info["length"], "length", where) if "length" in info else size - offset
    if offset + max(length, 0) > size or length < 0:
        raise ModelImportError(
            f"{where} at offset {offset}, length {info.get('length', 'to the end')}, past "
            f"the end of that file ({size} bytes); the data file does not belong to this "
            "model: save the model and its data again")
    want = _nbytes(tensor)
    if want is not None and want != length:
        raise ModelImportError(
            f"{where}: {length} bytes, but its shape {list(tensor.dims)} of "
            f"{TensorProto.DataType.Name(tensor.data_type)} takes {want}; the data file "
            "does not belong to this model: save the model and its data again")
    return offset, length


def _whole(text: str, key: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelImportError(f"{where} with {key} {text!r}, not a whole number of bytes; "
                               "save the model and its data again")
    return value


def _nbytes(tensor: TensorProto) -> int | None:
    """Bytes of the tensor's data, or None where its element type has no fixed size."""
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED) or \
            TensorProto.DataType.Name(tensor.data_type).endswith(("INT4", "INT2", "E2M1")):
        return None  # strings vary; packed sub-byte types round up per tensor
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None  # an unknown element type: the importer names it
    return math.prod(tensor.dims) * itemsize


def _read(s: _Slice, source: str) -> bytes:
    """The bytes of one checked slice; the file must still be the regular one checked."""
    try:
        fd = os.open(s.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise ModelImportError(f"{source}: cannot read the data of tensor {s.tensor.name!r} "
                               f"from {s.path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the check
            raise ModelImportError(f"{source}: {s.path} changed while it was being read")
        try:
            f.seek(s.offset)
            data = f.read(s.length)
        except OSError as err:  # EIO from a failing disk or a dropped network mount
            raise ModelImportError(
                f"{source}: reading the data of tensor {s.tensor.name!r} from {s.path} "
                f"failed: {err.strerror or err}; check the disk or mount it is on and "
                "import again") from None
    if len(data) != s.length:
        raise ModelImportError(f"{source}: {s.path} changed while it was being read "
                               f"(tensor {s.tensor.name!r})")
    return data
