"""Reference inputs and outputs: random model inputs, ONNX Runtime runs, error metric."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from tvm_fusion.frontend.shapes import TensorInfo


def random_inputs(inputs: Sequence[TensorInfo], seed: int = 0) -> list[np.ndarray]:
    """Deterministic random arrays for model inputs.

    Parameters
    ----------
    inputs : sequence of TensorInfo
        The inputs, e.g. ``ImportedModel.inputs``.
    seed : int
        Seed of the generator; the same seed gives the same arrays.

    Returns
    -------
    list of numpy.ndarray
        Floats: standard normal. Integers: uniform in [0, 100), except inputs whose name
        contains "mask" get ones (attention masks must keep tokens). Bools: random.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for info in inputs:
        dtype = np.dtype(info.dtype)
        if dtype == np.bool_:
            arr = rng.integers(0, 2, size=info.shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            arr = (np.ones(info.shape, dtype) if "mask" in info.name.lower()
                   else rng.integers(0, 100, size=info.shape).astype(dtype))
        elif np.issubdtype(dtype, np.floating) or dtype.kind == "V":  # "V": ml_dtypes floats
            arr = rng.standard_normal(size=info.shape).astype(np.float32).astype(dtype)
        else:
            raise TypeError(f"no random generator for input {info.name!r} of dtype {dtype}")
        arrays.append(np.asarray(arr))
    return arrays


def run_onnxruntime(onnx_model: onnx.ModelProto, inputs: Sequence[np.ndarray], *,
                    threads: int | None = None, optimize: bool = True) -> list[np.ndarray]:
    """Run a model with ONNX Runtime on the CPU.

    Parameters
    ----------
    onnx_model : onnx.ModelProto
        The model, e.g. ``ImportedModel.onnx_model``.
    inputs : sequence of numpy.ndarray
        One array per model input (initializers excluded), in graph input order.
    threads : int, optional
        Intra-op threads; ONNX Runtime's default when None.
    optimize : bool
        ONNX Runtime's graph optimizations (default on). Off, a QDQ graph runs op by op
        (DequantizeLinear, float Conv, QuantizeLinear) instead of as QLinearConv /
        QLinearMatMul, whose u8 x s8 kernels saturate 16-bit pair sums on x86 CPUs
        without VNNI (ONNX Runtime's quantization docs): there the unoptimized run is
        the exact evaluation of the graph.

    Returns
    -------
    list of numpy.ndarray
        The outputs in the model's output order.
    """
    import onnxruntime as ort  # deferred: only reference checks need it

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: unused-initializer notes are noise here
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(onnx_model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(inputs):
        raise ValueError(f"the model takes {len(names)} inputs {names}, got {len(inputs)} arrays")
    outputs = session.run(None, dict(zip(names, inputs)))
    return [np.asarray(o) for o in outputs]


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """Norm-wise relative error ``max|got - want| / max|want|``.

    Dividing by the largest magnitude of ``want`` instead of element-wise keeps the
    measure stable where ``want`` is near zero. A shape or dtype mismatch is ``inf``.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf")
    if got.size == 0:
        return 0.0
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not (np.isfinite(g).all() and np.isfinite(w).all()):
        # Equal non-finite values (e.g. -inf masks) agree; anything else does not.
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        finite = np.isfinite(g) & np.isfinite(w)
        if not (same | finite).all():
            return float("inf")
        g, w = np.where(finite, g, 0.0), np.where(finite, w, 0.0)
    scale = max(float(np.abs(w).max()), 1e-30)
    return float(np.abs(g - w).max()) / scale
