"""Graph simplification between import and planning.

What ONNX Runtime's level-1/2 optimizers do to an exported model before it runs, on the
Relax module: identity and round-trip casts removed, transposes sunk until inverse pairs
cancel (NHWC convs kept NHWC), batch norms and per-channel affine ops folded into conv
and matmul weights, then common subexpressions and dead code removed. The planner then
sees the real graph. :func:`import_model` (``tvm_fusion.import_model``) runs it by
default; ``simplify=False`` (CLI ``--no-simplify``) keeps the graph as converted.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

import tvm_ffi

from ..frontend import ImportedModel
from ..frontend import import_model as _import_raw
from ..frontend.onnx_import import ModelSource
from .pipeline import simplify_module
from .report import SimplifyReport

# Bumped when a rewrite changes what it produces: models simplified by another version
# get another hash, so their tuning records and plans are kept apart.
SIMPLIFY_VERSION = 1
_DEFAULTS = {"transposes": True, "nhwc": True, "affine": True, "combine_matmul": False}


def simplify_model(model: ImportedModel, **options) -> ImportedModel:
    """``model`` with its module simplified (see :func:`simplify_module` for options).

    Parameters
    ----------
    model : ImportedModel
        From :func:`tvm_fusion.frontend.import_model` (not simplified yet).
    **options
        ``transposes``, ``nhwc``, ``affine``, ``combine_matmul``, ``stack_matmuls``,
        ``one_hot`` of :func:`simplify_module`.

    Returns
    -------
    ImportedModel
        With the simplified ``mod``, ``simplified`` set to the report and
        ``unsimplified`` to ``model``. When the module changed, ``model_hash`` changes
        too (tuning logs key models by it, and the simplified graph has other kernels);
        an unchanged module keeps its hash, so its logs still apply.
    """
    if model.simplified is not None:
        return model
    mod, report = simplify_module(model.mod, **options)
    digest = model.model_hash
    if not tvm_ffi.structural_equal(mod, model.mod):
        opts = sorted({**_DEFAULTS, **options}.items())
        tag = f"{model.model_hash}:simplify-v{SIMPLIFY_VERSION}:{opts}"
        if report.line_convs:  # a later rewrite: only the models it changed get a new hash
            tag += f":line-convs-{report.line_convs}"
        if report.matmuls_stacked:  # likewise
            tag += f":stacked-{report.matmuls_stacked}"
        if report.one_hot_gathers:  # likewise
            tag += f":one-hot-{report.one_hot_gathers}"
        digest = hashlib.sha256(tag.encode()).hexdigest()
    return dataclasses.replace(model, mod=mod, model_hash=digest, simplified=report,
                               unsimplified=model)


def import_model(model: ModelSource, shapes: Mapping[str, Sequence[int]] | None = None, *,
                 name: str | None = None, consts: Mapping | None = None,
                 simplify: bool | Mapping[str, bool] = True) -> ImportedModel:
    """Import an ONNX model into Relax and simplify its graph.

    Parameters
    ----------
    model, shapes, name, consts :
        As :func:`tvm_fusion.frontend.import_model`.
    simplify : bool or mapping
        Run graph simplification (default). False keeps the module as converted, e.g.
        to compare before and after, or to deploy logs tuned before simplification; a
        mapping runs it with those options of :func:`simplify_module`.

    Returns
    -------
    ImportedModel
        ``simplified`` holds the :class:`SimplifyReport` (None with ``simplify=False``).

    Raises
    ------
    ModelImportError, MissingShapeError, UnsupportedOpError
        As :func:`tvm_fusion.frontend.import_model`.
    """
    raw = _import_raw(model, shapes, name=name, consts=consts)
    if not simplify:
        return raw
    return simplify_model(raw, **(simplify if isinstance(simplify, Mapping) else {}))


__all__ = ["SIMPLIFY_VERSION", "SimplifyReport", "import_model", "simplify_model",
           "simplify_module"]
