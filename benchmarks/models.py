"""The models the harness knows: the embedded demo model and the zoo.

Each is imported once with tvm-fusion's frontend (fixed shapes, folded shape subgraphs);
every TVM-based system starts from that Relax module, while ONNX Runtime and PyTorch run
the model file as shipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from tvm_fusion import zoo

EMBEDDED = "embedded"
NAMES: tuple[str, ...] = (EMBEDDED, *zoo.ZOO)

# Inputs that random_inputs cannot guess. silero-vad's ``sr`` picks the branch of its
# top-level If: 16000 runs the 16 kHz branch, the one the 512-sample chunk belongs to.
_INPUT_OVERRIDES: dict[str, dict[str, np.ndarray]] = {
    "silero-vad": {"sr": np.array(16000, dtype=np.int64)},
}


@dataclass(frozen=True)
class BenchModel:
    """A model ready to benchmark."""

    name: str
    imported: object              # tvm_fusion.ImportedModel
    original: onnx.ModelProto     # the file as shipped (ONNX Runtime, PyTorch run this)
    description: str

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: tuple(t.shape) for t in self.imported.inputs}

    def inputs(self, seed: int = 0) -> list[np.ndarray]:
        """The benchmark inputs, the same for every system."""
        from tvm_fusion.reference import random_inputs

        arrays = random_inputs(self.imported.inputs, seed=seed)
        for i, info in enumerate(self.imported.inputs):
            fixed = _INPUT_OVERRIDES.get(self.name, {}).get(info.name)
            if fixed is not None:
                arrays[i] = fixed.astype(info.dtype).reshape(info.shape)
        return arrays


def describe(name: str) -> str:
    if name == EMBEDDED:
        return "built-in residual CNN + MLP head (tvm_fusion.embedded), input (1, 3, 32, 32)"
    return zoo.ZOO[name].description


def load(name: str) -> BenchModel:
    """Fetch (zoo models, cached outside the repo) and import a model.

    Raises whatever the zoo or the frontend raises; the caller records it.
    """
    import tvm_fusion

    if name == EMBEDDED:
        from tvm_fusion.embedded import build_embedded_model

        proto = build_embedded_model()
        imported = tvm_fusion.import_model(proto, name=EMBEDDED)
        return BenchModel(EMBEDDED, imported, proto, describe(name))
    if name not in zoo.ZOO:
        raise KeyError(f"no model {name!r}; known: {', '.join(NAMES)}")
    path = zoo.fetch(name)
    imported = tvm_fusion.import_model(path, zoo.ZOO[name].shapes, name=name)
    return BenchModel(name, imported, onnx.load(str(path)), describe(name))


def graph_check(model: BenchModel) -> str | None:
    """None when tvm-fusion's graph stage accepts the model, else why not."""
    import tvm_fusion

    try:
        tvm_fusion.build_graph(model.imported.mod)
    except Exception as err:  # noqa: BLE001 - any rejection is reported, not raised
        return f"{type(err).__name__}: {err}"
    return None


def availability(name: str) -> tuple[str, str]:
    """``(status, note)`` of one model for ``--list``: fetch, import and graph stage."""
    try:
        model = load(name)
    except zoo.ZooUnavailable as err:
        return "skipped", f"cannot fetch: {err}"
    except Exception as err:  # noqa: BLE001
        return "skipped", f"import fails: {type(err).__name__}: {str(err).splitlines()[0]}"
    shapes = ", ".join(f"{k}={list(v)}" for k, v in model.shapes.items())
    reason = graph_check(model)
    if reason:
        return "partial", (f"{shapes}; tvm-fusion's graph stage rejects it ({reason}): its "
                           "tvm-fusion rows will fail, the other systems run")
    return "ok", shapes
