"""The model a user names on the command line: an ``.onnx`` file, the embedded demo
model, or a zoo model (downloaded on first use, with its default shapes), imported and
simplified (``simplify.import_model``, the public ``import_model``)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from . import zoo
from .embedded import build_embedded_model
from .errors import TvmFusionError
from .frontend import ImportedModel, parse_shape
from .frontend.consts import parse_const
from .simplify import import_model


def load_model_spec(spec: str, shapes: list[str] | None = None,
                    consts: list[str] | None = None, *, simplify=True
                    ) -> ImportedModel:
    """Import the model a user names: an ``.onnx`` file, ``embedded`` or a zoo name.

    Parameters
    ----------
    spec : str
        The MODEL argument of the command line.
    shapes : list of str, optional
        ``NAME=D1,D2,...`` input shapes (``--shape``), over a zoo model's defaults.
    consts : list of str, optional
        ``NAME=VALUE`` inputs fixed as constants (``--const``).
    simplify : bool or mapping
        Simplify the graph after import (``--no-simplify``: False); a mapping: with
        those options of :func:`~tvm_fusion.simplify.simplify_module`.

    Raises
    ------
    TvmFusionError
        A name that is neither a file nor a zoo model (the zoo names listed).
    """
    given = dict(parse_shape(s) for s in shapes or [])
    fixed = dict(parse_const(c) for c in consts or []) or None
    if spec == "embedded":
        return import_model(build_embedded_model(), given or None, name="embedded",
                            consts=fixed, simplify=simplify)
    if not Path(spec).exists() and not spec.endswith(".onnx"):
        if spec in zoo.ZOO:
            model = zoo.ZOO[spec]
            shapes = {k: v for k, v in {**model.shapes, **given}.items()
                      if k not in (fixed or {})}
            return import_model(zoo.fetch(spec), shapes, name=spec, consts=fixed,
                                simplify=simplify)
        if os.sep not in spec and not spec.endswith(".onnx"):  # a name, not a path
            close = difflib.get_close_matches(spec, list(zoo.ZOO), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise TvmFusionError(
                f"{spec!r} is neither a file nor a known model name; {hint}MODEL is an "
                f".onnx file, `embedded`, or a zoo name: {', '.join(sorted(zoo.ZOO))}")
    return import_model(spec, given or None, consts=fixed, simplify=simplify)
