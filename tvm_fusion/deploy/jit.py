"""JIT: compile a model from tuning logs on first call per input-shape signature.

Executables are cached on disk (``$TVM_FUSION_JIT_CACHE``, else
``~/.cache/tvm-fusion/jit``, or ``cache_dir``), keyed by everything that decides what gets built: the model bytes and input shapes
(the model hash), the target key and hardware hash, the content of the log directory
(manifest and database files), and the TVM, tvm-fusion and module format versions. A
second process with the same key loads the library instead of compiling; a changed log
or an upgrade compiles afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import config
from ..errors import ModuleLoadError, TvmFusionError
from ..simplify import SIMPLIFY_VERSION, import_model
from ..frontend.onnx_import import _load as load_onnx
from ..frontend.onnx_import import model_hash
from ..frontend.shapes import graph_inputs
from ..plan import PlanOptions
from ..targets import HardwareTarget, as_target
from ..logs.dirs import content_hash, target_dir
from ..logs.manifest import target_key, versions
from .build import MODULE_VERSION, compile_model, sidecar_path
from .module import Module, load_module


class UntunedShapeWarning(UserWarning):
    """A shape signature runs kernels with default schedules (no tuning records)."""


def _kinds(info: dict) -> str:
    """``"3 predicted, 5 rule default"``: how the kernels without a record were scheduled."""
    kinds = [k for k in info.get("schedules", {}).values() if k != "measured"]
    return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds)) or "defaults"


def _options_key(options: PlanOptions) -> dict:
    """The plan options a cache key holds: each one set away from its default (so the
    defaults keep the keys they had). ``prepack`` unset is the logs' setting, in their
    hash; a group model is keyed by its training sidecar, else by the object itself
    (this process only)."""
    default = PlanOptions()
    key = {f.name: getattr(options, f.name) for f in dataclasses.fields(PlanOptions)
           if f.name != "group_model" and getattr(options, f.name) != getattr(default, f.name)}
    gm = options.group_model
    if gm is not None:
        meta = getattr(gm, "meta", None)
        key["group_model"] = (json.dumps(meta, sort_keys=True, default=str)
                              if isinstance(meta, dict) else f"{type(gm).__qualname__}@{id(gm)}")
    return key


def default_cache_dir() -> Path:
    """Where JIT executables are cached when no ``cache_dir`` is given."""
    return Path(config.JIT_CACHE.get()).expanduser()


@dataclass(frozen=True, kw_only=True)
class JitEvent:
    """What the first call of one signature did: ``compiled`` or loaded from ``cache``."""

    kind: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    path: Path
    untuned: tuple[str, ...]


class JitFunction:
    """A model callable with numpy arrays; compiles per input-shape signature.

    Created by :func:`jit`. Call it like :class:`~tvm_fusion.Module` (positionally in
    the model's input order or by input name); it returns the outputs as numpy arrays.
    ``events`` lists what each new signature did (compiled or loaded from the cache).
    """

    def __init__(self, model, *, target, logs, cache_dir, allow_other_target, name,
                 simplify=True, plan_options: PlanOptions = PlanOptions()):
        self._raw, self._proto, self.source = load_onnx(model, name)
        # a path keeps external weights (models over 2 GB) loadable by the importer
        self._model = model if isinstance(model, (str, os.PathLike)) else self._raw
        self.input_names = tuple(i.name for i in graph_inputs(self._proto))
        self.hw = as_target(target)
        self.logs = None if logs is None else Path(logs)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.allow_other_target = allow_other_target
        self.simplify = simplify
        self.plan_options = plan_options
        self._modules: dict[tuple, Module] = {}
        self._lock = threading.Lock()
        self.events: list[JitEvent] = []

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        named = self._named(args, kwargs)
        sig = tuple((n, tuple(np.shape(named[n]))) for n in self.input_names)
        mod = self._modules.get(sig)
        if mod is None:
            with self._lock:
                mod = self._modules.get(sig) or self._module_for(sig)
                self._modules[sig] = mod
        return mod(**named)

    def _named(self, args, kwargs) -> dict:
        if len(args) > len(self.input_names):
            raise ModuleLoadError(f"got {len(args)} inputs, {self.source} takes "
                                  f"{len(self.input_names)}: {list(self.input_names)}")
        named = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise ModuleLoadError(f"no input named {k!r}; inputs are "
                                      f"{list(self.input_names)}")
            if k in named:
                raise ModuleLoadError(f"input {k!r} given twice")
            named[k] = v
        missing = [n for n in self.input_names if n not in named]
        if missing:
            raise ModuleLoadError(f"missing inputs {missing} of {self.source}")
        return named

    def cache_key(self, shapes) -> str:
        """The cache key of one signature (``shapes``: ``[(name, shape)]`` in input order)."""
        tdir = target_dir(self.logs, self.hw.name) if self.logs is not None else None
        doc = {
            "model": model_hash(self._raw, [(n, tuple(s)) for n, s in shapes]),
            "target_key": target_key(self.hw.tvm_config),
            "hardware_hash": self.hw.hardware_hash,
            "logs": content_hash(tdir) if tdir is not None else None,
            "allow_other_target": self.allow_other_target,
            "simplify": SIMPLIFY_VERSION if self.simplify else None,
            "module_version": MODULE_VERSION, **versions(),
        }
        doc.update(_options_key(self.plan_options))
        text = json.dumps(doc, sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:32]

    def _module_for(self, sig) -> Module:
        key = self.cache_key(sig)
        lib = self.cache_dir / f"{key}.so"
        kind = "cache"
        mod = None
        if lib.exists() and sidecar_path(lib).exists():
            try:
                mod = load_module(lib)
            except TvmFusionError:
                mod = None  # a damaged cache entry: rebuild it
        if mod is None:
            kind = "compiled"
            mod = self._compile(sig, lib)
        untuned = tuple(mod.info.get("untuned", ()))
        self.events.append(JitEvent(kind=kind, shapes=sig, path=lib, untuned=untuned))
        if untuned:  # once per signature: it is cached in self._modules afterwards
            shapes = ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in sig)
            where = (f"the logs in {target_dir(self.logs, self.hw.name)}"
                     if self.logs is not None else "no logs (logs=None)")
            shape_args = " ".join(f"--shape {n}={','.join(map(str, s))}" for n, s in sig)
            warnings.warn(
                f"tvm_fusion.jit: {self.source} with {shapes}: {len(untuned)} of "
                f"{len(mod.info['kernels'])} kernels have no tuning record in {where} and run "
                f"with schedules chosen without measurement ({_kinds(mod.info)}: "
                f"{', '.join(untuned[:3])}"
                f"{', ...' if len(untuned) > 3 else ''}); tune this shape with "
                f"`tvm-fusion tune MODEL {shape_args} --target {self.hw.name} --logs DIR`",
                UntunedShapeWarning, stacklevel=4)
        return mod

    def _compile(self, sig, lib: Path) -> Module:
        model = import_model(self._model, dict(sig), name=self.source,
                             simplify=self.simplify)
        logs = self.logs if self.logs is not None and self.logs.exists() else None
        compiled = compile_model(model, self.hw, logs=logs,
                                 allow_other_target=self.allow_other_target,
                                 plan_options=self.plan_options)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # Export under a temporary name, then rename: a concurrent process sees either
        # no entry or a whole one (the library first, its description last).
        tmp = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=".build-"))
        try:
            compiled.export(tmp / "m.so")
            os.replace(tmp / "m.so", lib)
            os.replace(sidecar_path(tmp / "m.so"), sidecar_path(lib))
        finally:
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
        return load_module(lib)


def jit(model, *, target: str | HardwareTarget = "host", logs: str | Path | None = None,
        cache_dir: str | Path | None = None, allow_other_target: bool = False,
        name: str | None = None, simplify: bool = True,
        plan_options: PlanOptions = PlanOptions()) -> JitFunction:
    """A callable that compiles ``model`` from ``logs`` on first call per input shape.

    Parameters
    ----------
    model : str, os.PathLike, onnx.ModelProto or bytes
        The ONNX model; inputs may have dynamic dims (each call's shapes fix them).
    target : str or HardwareTarget
        A name from ``hw_targets/`` or ``"host"``.
    logs : path, optional
        A tuning log directory. A signature it has no records for still runs, with
        default schedules, and says so once (:class:`UntunedShapeWarning`).
    cache_dir : path, optional
        Where executables are cached; default :func:`default_cache_dir`.
    allow_other_target : bool
        Use logs whose manifest names another target (refused by default).
    name : str, optional
        What to call the model in messages.
    simplify : bool
        Simplify the graph before planning (default), as :func:`tvm_fusion.import_model`.
    plan_options : PlanOptions
        How a signature the logs hold no plan for is planned (planner, layout, combine,
        resources, group_model); a stored plan keeps its own. ``prepack``: as
        :func:`~tvm_fusion.compile_model`, by default the setting each signature's
        records were tuned with (the module then carries the packed weights). Every
        field set away from its default is part of the cache key.

    Returns
    -------
    JitFunction

    Notes
    -----
    Calls :func:`tvm_fusion.config.use_all_cores` first, as :func:`~tvm_fusion.compile_model`.
    """
    config.use_all_cores()  # before the first kernel runs: TVM's default is half the cores
    return JitFunction(model, target=target, logs=logs, cache_dir=cache_dir,
                       allow_other_target=allow_other_target, name=name,
                       simplify=simplify, plan_options=plan_options)
