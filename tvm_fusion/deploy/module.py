"""Load an exported module and call it with numpy arrays."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

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

    def __init__(self, vm: relax.VirtualMachine, info: dict, device):
        self._vm, self._dev, self.info = vm, device, info
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
        return [t.numpy() for t in _flatten(self._vm["main"](*tensors))]

    def benchmark(self, *args, repeat: int = 50, min_repeat_ms: int = 200, **kwargs
                  ) -> dict:
        """Median and spread of the latency of one call, in milliseconds."""
        tensors = self._arguments(args, kwargs)
        timer = self._vm.time_evaluator("main", self._dev, number=1, repeat=repeat,
                                        min_repeat_ms=0)
        self._vm["main"](*tensors)  # warm-up
        res = timer(*tensors)
        times = np.array(res.results) * 1e3
        return {"median_ms": float(np.median(times)), "p10_ms": float(np.percentile(times, 10)),
                "p90_ms": float(np.percentile(times, 90)), "repeat": len(times)}


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
    """
    path = Path(path)
    meta = sidecar_path(path)
    if not path.exists():
        raise ModuleLoadError(f"no compiled module at {path}; build one with "
                              "`tvm-fusion compile MODEL --target T -o OUT.so`")
    if not meta.exists():
        raise ModuleLoadError(f"{path} has no description {meta.name} beside it; copy it "
                              "along with the library (tvm-fusion compile writes both)")
    rebuild = "rebuild it with `tvm-fusion compile` (it writes both files)"
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
        return Module(vm, info, dev)
    except (KeyError, TypeError, ValueError) as e:
        raise ModuleLoadError(f"{meta} does not describe {path.name}'s inputs and outputs "
                              f"({type(e).__name__}: {e}); {rebuild}") from None
    except Exception as e:  # noqa: BLE001
        raise ModuleLoadError(f"cannot load {path}: {str(e).splitlines()[-1]}") from e
