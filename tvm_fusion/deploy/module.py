"""Load an exported module and call it with numpy arrays."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from .. import config
from ..errors import ModuleLoadError
from .build import MODULE_SCHEMA, MODULE_VERSION, library_digest, sidecar_path


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of a model input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def _flatten(result) -> list:
    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    out = []
    for r in result:
        out.extend(_flatten(r))
    return out


class Module:
    """A compiled model, callable with numpy arrays.

    Call it positionally in the model's input order, or by input name; it returns the
    outputs as a list of numpy arrays in the model's output order.
    """

    def __init__(self, vm: relax.VirtualMachine, info: dict, device, *,
                 path: Path | None = None):
        self._vm, self._dev, self.info = vm, device, info
        self._path = path
        self.input_info = tuple(TensorSpec(i["name"], tuple(i["shape"]), i["dtype"])
                                for i in info["inputs"])
        self.output_info = tuple(TensorSpec(o["name"], tuple(o["shape"]), o["dtype"])
                                 for o in info["outputs"])

    def _arguments(self, args, kwargs) -> list:
        if len(args) > len(self.input_info):
            raise ModuleLoadError(f"got {len(args)} inputs, the model takes "
                                  f"{len(self.input_info)}: {[i.name for i in self.input_info]}")
        named = dict(zip((i.name for i in self.input_info), args))
        for k, v in kwargs.items():
            if k not in {i.name for i in self.input_info}:
                raise ModuleLoadError(f"no input named {k!r}; inputs are "
                                      f"{[i.name for i in self.input_info]}")
            if k in named:
                raise ModuleLoadError(f"input {k!r} given twice")
            named[k] = v
        out = []
        for spec in self.input_info:
            if spec.name not in named:
                raise ModuleLoadError(f"missing input {spec.name!r} "
                                      f"(shape {spec.shape}, {spec.dtype})")
            a = np.asarray(named[spec.name])
            if tuple(a.shape) != spec.shape:
                raise ModuleLoadError(f"input {spec.name!r} has shape {tuple(a.shape)}, "
                                      f"the module was compiled for {spec.shape}")
            if str(a.dtype) != spec.dtype:
                if not np.can_cast(a.dtype, spec.dtype, casting="same_kind"):
                    raise ModuleLoadError(f"input {spec.name!r} is {a.dtype}, expected "
                                          f"{spec.dtype}")
                a = a.astype(spec.dtype)
            out.append(tvm.runtime.tensor(np.ascontiguousarray(a), self._dev))
        return out

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        tensors = self._arguments(args, kwargs)
        return [t.numpy() for t in self._invoke(tensors)]

    def _invoke(self, tensors: list) -> list:
        """``main`` on arguments checked against the description; the library refusing
        them, or returning other outputs, means the description is not its own."""
        try:
            outputs = _flatten(self._vm["main"](*tensors))
        except Exception as e:  # noqa: BLE001  (TVM's check errors have no common base)
            found = PARAM_CHECK.search(str(e))
            if found is None:
                raise
            spec = self.input_info[int(found["index"])]
            raise self._disagrees(
                f"its main takes input {found['name']!r} as {found['want']}, described as "
                f"{_specs_text([(spec.shape, spec.dtype)])} ({found['why'].strip()})") from None
        got = [(tuple(o.shape), str(o.dtype)) for o in outputs]
        said = [(o.shape, o.dtype) for o in self.output_info]
        if len(got) != len(said) or not all(map(_fits, got, said)):
            raise self._disagrees(f"its main returned {_specs_text(got)}, described as "
                                  f"{_specs_text(said)}")
        return outputs

    def _disagrees(self, what: str) -> ModuleLoadError:
        lib = self._path.name if self._path else "the library"
        side = sidecar_path(self._path).name if self._path else "its description"
        return ModuleLoadError(f"{lib} does not match {side}: {what}; the description belongs "
                               f"to another build: {REBUILD}")

    def benchmark(self, *args, repeat: int = 50, min_repeat_ms: int = 200, **kwargs
                  ) -> dict:
        """Median and spread of the latency of one call, in milliseconds."""
        tensors = self._arguments(args, kwargs)
        timer = self._vm.time_evaluator("main", self._dev, number=1, repeat=repeat,
                                        min_repeat_ms=0)
        self._invoke(tensors)  # warm-up, and the outputs checked
        res = timer(*tensors)
        times = np.array(res.results) * 1e3
        return {"median_ms": float(np.median(times)), "p10_ms": float(np.percentile(times, 10)),
                "p90_ms": float(np.percentile(times, 90)), "repeat": len(times)}


REBUILD = "rebuild it with `tvm-fusion compile` (it writes both files)"
# the VM's check of an argument failed: which one, its annotation, and why
PARAM_CHECK = re.compile(r"ErrorContext\(fn=main, loc=param\[(?P<index>\d+)\], "
                         r"param=(?P<name>[^,]*), annotation=(?P<want>.*?\))\)\s+(?P<why>.*)")
MAX_ELEMENTS = 2 ** 32  # per input or output: far past any model's, short of a bad alloc


def _specs_text(specs) -> str:
    return ", ".join(f"{'x'.join(map(str, shape)) or 'scalar'} {dtype}"
                     for shape, dtype in specs) or "nothing"


def _fits(got: tuple, said: tuple) -> bool:
    """An output as returned fits its description: its dtype and rank. Not its sizes: a
    data-dependent output (NonMaxSuppression's) is described by its largest shape, and
    one of unknown rank as ()."""
    (shape, dtype), (want, want_dtype) = got, said
    return dtype == want_dtype and (not want or len(shape) == len(want))


def _check_specs(info: dict, key: str, meta: Path) -> None:
    """``info[key]`` lists a name, a shape of whole sizes and a numeric dtype each
    (outputs may have sizes unknown at build time, -1)."""
    entries = info.get(key)
    if not isinstance(entries, list):
        raise ModuleLoadError(f"{meta} does not list the module's {key}; {REBUILD}")
    least = 0 if key == "inputs" else -1
    for i, e in enumerate(entries):
        try:
            ok = (isinstance(e["name"], str) and isinstance(e["shape"], list)
                  and all(type(d) is int and d >= least for d in e["shape"])
                  and np.prod(e["shape"], dtype=float) <= MAX_ELEMENTS
                  and np.dtype(e["dtype"]).kind in "biufc")
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ModuleLoadError(f"{meta}: {key}[{i}] is not a name, shape and numeric "
                                  f"dtype ({json.dumps(e)[:80]}); {REBUILD}")


def _numeric(value) -> bool:
    """A number or a regular nested list of numbers (an input fixed as a constant)."""
    try:
        np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return True


def _check_description(info: dict, vm, path: Path, meta: Path) -> None:
    """What the description says of ``main`` holds for the library: its inputs and
    outputs are well formed and it lists as many inputs as ``main`` takes (their shapes
    and dtypes are checked by the VM at the call, see :meth:`Module._invoke`)."""
    for key in ("inputs", "outputs"):
        _check_specs(info, key, meta)
    consts = info.get("consts") or {}
    if not isinstance(consts, dict) or not all(isinstance(k, str) and _numeric(v)
                                               for k, v in consts.items()):
        raise ModuleLoadError(f"{meta}: 'consts' is not an object of input values; {REBUILD}")
    arity = vm._get_function_arity("main")
    if arity != len(info["inputs"]):
        params = [vm._get_function_param_name("main", i) for i in range(arity)]
        raise ModuleLoadError(
            f"{path.name} does not match {meta.name}: its main takes {arity} inputs "
            f"{params}, the description lists {len(info['inputs'])} "
            f"{[i['name'] for i in info['inputs']]}; the description belongs to another "
            f"build: {REBUILD}")


def load_module(path: str | Path) -> Module:
    """Load a module exported by ``tvm-fusion compile`` / :meth:`CompiledModel.export`.

    Parameters
    ----------
    path : path
        The shared library; its description ``path.json`` must lie beside it.

    Returns
    -------
    Module

    Raises
    ------
    ModuleLoadError
        No library or description, a description that is not one (corrupt JSON, not an
        object, of another version or TVM), or a library whose size or sha256 differs
        from what its description recorded (truncated or changed since it was written).

    Notes
    -----
    Calls :func:`tvm_fusion.config.use_all_cores` first: the module's parallel loops run
    on every core unless ``TVM_NUM_THREADS`` says otherwise.
    """
    config.use_all_cores()  # before the first kernel runs: TVM's default is half the cores
    path = Path(path)
    meta = sidecar_path(path)
    if not path.exists():
        raise ModuleLoadError(f"no compiled module at {path}; build one with "
                              "`tvm-fusion compile MODEL --target T -o OUT.so`")
    if not meta.exists():
        raise ModuleLoadError(f"{path} has no description {meta.name} beside it; copy it "
                              "along with the library (tvm-fusion compile writes both)")
    rebuild = REBUILD
    try:
        info = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModuleLoadError(f"{meta}, the description of {path}, cannot be read as JSON "
                              f"({e}); {rebuild}") from None
    if not isinstance(info, dict) or info.get("schema") != MODULE_SCHEMA:
        raise ModuleLoadError(f"{meta} is not a tvm-fusion module description; {rebuild}")
    if info.get("version") != MODULE_VERSION:
        raise ModuleLoadError(f"{meta} is a module description of version "
                              f"{info.get('version')}, this tvm-fusion reads version "
                              f"{MODULE_VERSION}; {rebuild}")
    if info.get("tvm") != tvm.__version__:
        raise ModuleLoadError(f"{path} was built with TVM {info.get('tvm')}, this runtime is "
                              f"TVM {tvm.__version__}; rebuild it with `tvm-fusion compile`")
    # Loading a truncated library maps pages past its end: SIGBUS, no message. Check first.
    want = info.get("library")
    if not isinstance(want, dict):
        raise ModuleLoadError(f"{meta} does not record the size and sha256 of {path.name}; "
                              f"{rebuild}")
    got = library_digest(path)
    if got != {"size": want.get("size"), "sha256": want.get("sha256")}:
        raise ModuleLoadError(
            f"{path} is damaged: {got['size']} bytes, sha256 {got['sha256'][:12]}..., but "
            f"{meta.name} recorded {want.get('size')} bytes, sha256 "
            f"{str(want.get('sha256'))[:12]}... (cut short or changed after it was "
            f"written); copy it again with its {meta.name}, or {rebuild}")
    tvm_target = info.get("tvm_target")
    kind = tvm_target.get("kind") if isinstance(tvm_target, dict) else None
    if kind is not None and not _known_runtime(kind):
        raise ModuleLoadError(f"{meta} names the target kind {kind!r}, which TVM does not "
                              f"know; {rebuild}")
    if kind not in (None, "llvm", "c") and not tvm.runtime.enabled(kind):
        what = {"rocm": f"gfx90a code objects for {info.get('target')} (ROCm): running them "
                        "takes a TVM built with USE_ROCM=ON on a machine with an AMD GPU",
                "cuda": f"CUDA kernels for {info.get('target')}: running them takes a TVM "
                        "built with USE_CUDA=ON on a machine with an NVIDIA GPU"}
        raise ModuleLoadError(
            f"cannot load {path} here: it holds "
            + what.get(kind, f"{kind} kernels, and this TVM has no {kind} runtime")
            + f"; this TVM {tvm.__version__} has no {kind} runtime. Copy {path.name} and "
              f"{meta.name} to that machine")
    try:
        kind = info["tvm_target"]["kind"]
        dev = tvm.cpu() if kind in ("llvm", "c") else tvm.device(kind, 0)
        vm_lib = tvm.runtime.load_module(str(path))
    except (KeyError, TypeError) as e:
        raise ModuleLoadError(f"{meta} lacks the module's target ({e}); {rebuild}") from None
    except Exception as e:  # noqa: BLE001  (TVM's loader errors)
        raise ModuleLoadError(f"cannot load {path}: {str(e).splitlines()[-1]}") from e
    try:
        vm = relax.VirtualMachine(vm_lib, dev)
    except Exception as e:  # noqa: BLE001
        raise ModuleLoadError(f"cannot load {path}: {str(e).splitlines()[-1]}") from e
    _check_description(info, vm, path, meta)
    return Module(vm, info, dev, path=path)


def _known_runtime(kind) -> bool:
    """Whether TVM knows ``kind`` as a runtime (enabled here or not)."""
    if kind in ("llvm", "c"):
        return True
    if not isinstance(kind, str) or not kind:
        return False
    try:
        tvm.runtime.enabled(kind)
    except Exception:  # noqa: BLE001  (TVM's InternalError: "Unknown optional runtime")
        return False
    return True
