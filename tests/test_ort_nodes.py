"""benchmarks/ort_nodes.py: ONNX Runtime's profiled nodes traced back to the ONNX nodes
they stand for, when ORT fuses and renames them (no tuning, no TVM build: cheap)."""

from __future__ import annotations

import numpy as np

from benchmarks.ort_nodes import OrtProfile, named
from onnx_cases import _vi, T, const, h, make


def test_fused_gemm_nodes_trace_back_to_their_matmul():
    rng = np.random.default_rng(0)
    proto = named(make("mm_add_softmax", [
        h.make_node("Relu", ["x"], ["r"], name="pre/Relu"),
        h.make_node("MatMul", ["r", "w"], ["m"], name="layer/dense/MatMul"),
        h.make_node("Add", ["m", "b"], ["a"], name="layer/dense/Add"),
        h.make_node("Softmax", ["a"], ["y"], axis=-1),  # unnamed: named Softmax_3
    ], [_vi("x", T.FLOAT, [2, 64, 32])], [_vi("y", T.FLOAT, [2, 64, 48])],
        [const("w", rng.standard_normal((32, 48))), const("b", rng.standard_normal(48))]))
    names = [n.name for n in proto.graph.node]
    assert names[3] == "Softmax_3"
    prof = OrtProfile(proto, {"x": rng.standard_normal((2, 64, 32)).astype(np.float32)})
    for k in range(3):  # 3 timed runs; the 0 + 1 + 2 warm ones before them are left out
        prof.run(warm=k)
    got = prof.finish()
    stands = {k: {names[i] for i in v["seeds"]} for k, v in got["nodes"].items()}
    # ORT runs the 3-D MatMul+Add as one Gemm named "<matmul>/MatMulAddFusion" between
    # reshapes of its own, so its output is no tensor of the model
    (gemm,) = [k for k, v in got["nodes"].items() if v["op"] == "Gemm"]
    # (not the Relu that feeds it, whose tensor its input reshape reads)
    assert stands[gemm] and stands[gemm] <= {"layer/dense/MatMul", "layer/dense/Add"}, stands
    assert stands["Softmax_3"] == {"Softmax_3"}
    assert all(stands.values()) and got["runs"] == 3 and got["run_us"] > 0
