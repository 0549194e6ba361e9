"""The roofline floor of a model on this machine, from peaks the harness measures itself.

Peak FLOP/s: a large fp32 GEMM through numpy's BLAS, in a subprocess whose environment
has OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed (some machines set them to values
that halve OpenBLAS; they are removed for that measurement alone). Bandwidth: a large
array copy, counted as read + write bytes, single-threaded and split over all cores;
the better of the two.

Floor of a model: max(FLOPs / peak, minimum DRAM bytes / bandwidth), where FLOPs are
the sum of ``OpNode.flops`` of ``tvm_fusion.build_graph(model.mod)`` and the minimum
bytes are the inputs, the weights (initializers and Constant tensors of the shape-fixed
ONNX model) and the outputs, each moved once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import helper

UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

_PROBE = r"""
import json, os, threading, time
import numpy as np

def best(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)

n = int(os.environ["PROBE_GEMM_N"])
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
c = np.empty((n, n), dtype=np.float32)
t_gemm = best(lambda: np.matmul(a, b, out=c), int(os.environ["PROBE_REPS"]))

words = int(os.environ["PROBE_COPY_MB"]) * (1 << 20) // 4
src = np.ones(words, dtype=np.float32)
dst = np.zeros(words, dtype=np.float32)
t_copy1 = best(lambda: np.copyto(dst, src), int(os.environ["PROBE_REPS"]))
threads = os.cpu_count() or 1
bounds = np.linspace(0, words, threads + 1).astype(int)

def copy_all():
    ts = [threading.Thread(target=np.copyto, args=(dst[lo:hi], src[lo:hi]))
          for lo, hi in zip(bounds[:-1], bounds[1:])]
    for t in ts: t.start()
    for t in ts: t.join()

t_copyn = best(copy_all, int(os.environ["PROBE_REPS"]))
blas = {}
try:
    from threadpoolctl import threadpool_info
    blas = [{k: i.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for i in threadpool_info()]
except Exception:
    pass
print(json.dumps({"gemm_n": n, "gemm_s": t_gemm, "gemm_gflops": 2 * n**3 / t_gemm / 1e9,
                  "copy_mb": words * 4 / (1 << 20), "copy_gbs_1thread": 2 * words * 4 / t_copy1 / 1e9,
                  "copy_gbs_threads": 2 * words * 4 / t_copyn / 1e9, "copy_threads": threads,
                  "blas": blas}))
"""


def measure_machine(*, gemm_n: int = 3072, copy_mb: int = 256, reps: int = 4,
                    timeout_s: float = 600) -> dict:
    """Measure peak fp32 GEMM FLOP/s and copy bandwidth in a clean subprocess.

    Returns
    -------
    dict
        ``peak_gflops``, ``bandwidth_gbs`` and the raw measurements, plus which of the
        OpenBLAS variables were set in this process (and removed for the probe).
    """
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(PROBE_GEMM_N=str(gemm_n), PROBE_COPY_MB=str(copy_mb), PROBE_REPS=str(reps))
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"peak probe failed: {proc.stderr.strip()[-2000:]}")
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "peak_gflops": raw["gemm_gflops"],
        "bandwidth_gbs": max(raw["copy_gbs_1thread"], raw["copy_gbs_threads"]),
        "unset_for_probe": {k: os.environ[k] for k in UNSET if k in os.environ},
        "raw": raw,
    }


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    n = int(np.prod(list(tensor.dims), dtype=np.int64))
    try:
        size = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        size = 0  # strings and other non-numeric tensors: not counted
    return n * size


def weight_bytes(proto: onnx.ModelProto) -> int:
    """Initializers plus the tensors of Constant nodes, subgraphs included."""
    total = 0

    def visit(graph: onnx.GraphProto):
        nonlocal total
        total += sum(_tensor_bytes(t) for t in graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and node.op_type == "Constant":
                    total += _tensor_bytes(attr.t)
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                for g in attr.graphs:
                    visit(g)

    visit(proto.graph)
    return total


def model_cost(imported) -> dict:
    """FLOPs and minimum DRAM bytes of an ImportedModel.

    ``flops`` is None (with ``flops_note`` saying why) when tvm-fusion's graph stage
    rejects the model.
    """
    def nbytes(infos):
        return sum(int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
                   for t in infos)

    io_in, io_out = nbytes(imported.inputs), nbytes(imported.outputs)
    weights = weight_bytes(imported.onnx_model)
    out = {"input_bytes": io_in, "weight_bytes": weights, "output_bytes": io_out,
           "min_bytes": io_in + weights + io_out, "flops": None, "flops_note": ""}
    try:
        from tvm_fusion import build_graph

        graph = build_graph(imported.mod)
        out["flops"] = float(sum(n.flops for n in graph.nodes))
        out["operators"] = len(graph.nodes)
    except Exception as err:  # noqa: BLE001 - recorded, the byte floor still holds
        out["flops_note"] = f"FLOPs unknown: {type(err).__name__}: {err}"
    return out


def floor_ms(cost: dict, machine: dict) -> float | None:
    """max(compute time, memory time) in ms; the memory time alone when FLOPs are unknown."""
    t_mem = cost["min_bytes"] / (machine["bandwidth_gbs"] * 1e9)
    t_flop = (cost["flops"] or 0.0) / (machine["peak_gflops"] * 1e9)
    return max(t_mem, t_flop) * 1e3
