"""Load an exported module and call it with numpy arrays."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from ..errors import ModuleLoadError
from .build import MODULE_SCHEMA, MODULE_VERSION, sidecar_path


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
    """
    path = Path(path)
    meta = sidecar_path(path)
    if not path.exists():
        raise ModuleLoadError(f"no compiled module at {path}; build one with "
                              "`tvm-fusion compile MODEL --target T -o OUT.so`")
    if not meta.exists():
        raise ModuleLoadError(f"{path} has no description {meta.name} beside it; copy it "
                              "along with the library (tvm-fusion compile writes both)")
    info = json.loads(meta.read_text())
    if info.get("schema") != MODULE_SCHEMA or info.get("version") != MODULE_VERSION:
        raise ModuleLoadError(f"{meta} is not a tvm-fusion module description of version "
                              f"{MODULE_VERSION}")
    if info.get("tvm") != tvm.__version__:
        raise ModuleLoadError(f"{path} was built with TVM {info.get('tvm')}, this runtime is "
                              f"TVM {tvm.__version__}; rebuild it with `tvm-fusion compile`")
    kind = info["tvm_target"]["kind"]
    dev = tvm.cpu() if kind in ("llvm", "c") else tvm.device(kind, 0)
    try:
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), dev)
    except Exception as e:
        raise ModuleLoadError(f"cannot load {path}: {str(e).splitlines()[-1]}") from e
    return Module(vm, info, dev)
