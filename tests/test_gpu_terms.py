"""GPU terms of the predicted time (tvm_fusion/plan/gpu_terms.py), each by hand.

A100 (hw_targets/a100.json): 108 SMs, 2048 threads, 65536 registers and 164 KB shared
memory per SM, 19.5 TFLOP/s fp32, 2039 GB/s, 40 MB L2, 4 us launch. dlight's SIMT
Matmul block: 128 threads (16 x 8, 4 x 4 outputs each: 32 x 64 of C), 64 registers,
(64 + 32) x (16 + 2) x 4 = 6912 B of shared memory.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.plan import AnalyticalCostModel
from tvm_fusion.plan.cost import GpuResources
from tvm_fusion.plan.gpu_terms import blocks_per_unit, occupancy, warps_needed

from test_planner import _model

MB = 1 << 20


@pytest.fixture(scope="module")
def a100():
    return tf.load_target("a100")


def _matmul(m, n, k, dtype=TensorProto.FLOAT, name="mm"):
    rng = np.random.default_rng(0)
    np_dtype = "float16" if dtype == TensorProto.FLOAT16 else "float32"
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np_dtype), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], name,
                              [helper.make_tensor_value_info("x", dtype, [m, k])],
                              [helper.make_tensor_value_info("y", dtype, [m, n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return tf.build_graph(tf.import_model(model, name=name).mod)


def test_occupancy_is_limited_by_registers_or_shared_memory(a100):
    gemm = GpuResources(schedule="gemm", kernels=1, threads_per_block=128,
                        registers_per_thread=64, shared_bytes=6912)
    # threads 2048 / 128 = 16, registers 65536 / (64 x 128) = 8, shared 167936 / 6912 = 24
    assert blocks_per_unit(a100, gemm) == 8
    assert occupancy(a100, gemm, 10_000).occupancy == 8 * 128 / 2048
    wmma = GpuResources(schedule="gemm-tensorcore", kernels=1, threads_per_block=512,
                        registers_per_thread=112, shared_bytes=73728)
    # registers: 65536 / (112 x 512) = 1 block, a quarter of the SM's threads
    assert blocks_per_unit(a100, wmma) == 1 and occupancy(a100, wmma, 1).occupancy == 0.25
    staged = GpuResources(schedule="reduction", kernels=1, threads_per_block=256,
                          registers_per_thread=24, shared_bytes=40960)
    # shared memory: 167936 / 40960 = 4 (threads would allow 8, registers 10)
    assert blocks_per_unit(a100, staged) == 4


def test_latency_hiding_follows_littles_law(a100):
    # 2039 GB/s x 500 ns / 108 SMs / (32 lanes x 16 B) = 18.44 warps per SM
    assert warps_needed(a100) == pytest.approx(2039 * 500 / 108 / 512)
    red = GpuResources(schedule="reduction", kernels=1, threads_per_block=256,
                       registers_per_thread=24, shared_bytes=1024)
    # 108 blocks: one per SM, 8 warps of the 18.44 needed
    one = occupancy(a100, red, 108)
    assert (one.waves, one.quantization) == (1, 1.0)
    assert one.latency_hiding == pytest.approx(8 / (2039 * 500 / 108 / 512))
    assert occupancy(a100, red, 108 * 8).latency_hiding == 1.0  # 64 warps


def test_one_block_more_than_a_wave_doubles_a_gemm(a100):
    """864 blocks of 32 x 64 fill A100's 108 x 8 slots once; 896 need a second wave
    that is 32 blocks full: the model predicts 1.93x the time for 0.1% more work."""
    full = AnalyticalCostModel(_matmul(864, 2048, 256, name="w1"), a100).group_cost([0])
    over = AnalyticalCostModel(_matmul(865, 2048, 256, name="w2"), a100).group_cost([0])
    assert (full.tiles, full.waves, over.tiles, over.waves) == (864, 1, 896, 2)
    assert full.bound == "compute"
    assert full.total_us == pytest.approx(2 * 864 * 2048 * 256 / 19.5e6 + 4)
    assert over.total_us == pytest.approx(2 * 865 * 2048 * 256 / 19.5e6 / (896 / 1728) + 4)


def test_small_m_gemm_uses_dlights_32x64_block(a100):
    """128 x 384 outputs: 4 x 6 = 24 blocks (64 x 64 tiles would give 12)."""
    cost = AnalyticalCostModel(_matmul(128, 384, 384, name="small"), a100).group_cost([0])
    assert cost.tiles == 24
    # 37.7 MFLOP at 19.5 TFLOP/s on 24 of 108 SMs is 8.7 us, but the 960 KB of x, w
    # and y come in with 4 warps per busy SM of the 18.44 that hide DRAM latency: 10 us
    nbytes = (128 * 384 + 384 * 384 + 128 * 384) * 4
    assert cost.bound == "compute" and cost.latency_hiding == pytest.approx(4 / 18.44, 1e-3)
    assert cost.total_us == pytest.approx(
        nbytes / 2039e3 / (24 / 108 * 4 / (2039 * 500 / 108 / 512)) + 4)


def test_an_intermediate_that_fits_l2_is_no_dram_traffic(a100):
    """relu -> sigmoid over 12 MB: the relu's result stays in A100's 40 MB L2, not in
    MI250X's 8 MB, so the sigmoid alone reads it from DRAM only on MI250X."""
    model = _model([helper.make_node("Relu", ["x"], ["r"]),
                    helper.make_node("Sigmoid", ["r"], ["y"])],
                   [("x", [3, 1024, 1024])], [("y", [3, 1024, 1024])], name="l2")
    graph = tf.build_graph(model.mod)
    on_a100 = AnalyticalCostModel(graph, a100)
    on_mi = AnalyticalCostModel(graph, tf.load_target("mi250x"))
    assert on_a100.cache_resident(0) and not on_mi.cache_resident(0)
    assert on_a100.group_cost([1]).dram_bytes == 12 * MB  # its output only
    assert on_mi.group_cost([1]).dram_bytes == 24 * MB
    plan = tf.plan_fusion(graph, "a100")
    # fused or not, A100 moves the same DRAM bytes: one launch is all fusing saves
    assert plan.groups[0].dram_bytes_avoided == 0 and len(plan.groups) == 1


def test_a_gather_reads_the_rows_it_gathers(a100):
    """take of 128 rows of a 4096 x 384 fp32 table: 196608 B of the 6 MB table."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((4096, 384)).astype("float32"), "t")
    graph = helper.make_graph([helper.make_node("Gather", ["t", "ids"], ["y"], axis=0)], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [1, 128, 384])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    og = tf.build_graph(tf.import_model(model, name="gather").mod)
    (take,) = [n for n in og.nodes if n.op.startswith("take")]
    cm = AnalyticalCostModel(og, a100)
    # the rows, not the table's 6 MB (the ids come from the kernel that bounds them)
    assert cm.const_bytes(take.id) == 128 * 384 * 4
    assert take.bytes_read >= 4096 * 384 * 4


def test_tensor_core_gemm_may_use_dynamic_shared_memory():
    """dlight's WMMA path stages 72 KB: above the 48 KB static limit, within the opt-in
    163 KB (A100) and 227 KB (H200) that count as its on-chip capacity."""
    graph = _matmul(256, 256, 256, TensorProto.FLOAT16, name="h")
    for target, cap in (("a100", 166912), ("h200", 232448)):
        cm = AnalyticalCostModel(graph, tf.load_target(target))
        assert cm.gpu_resources([0]).schedule == "gemm-tensorcore"
        cost = cm.group_cost([0])
        assert cost.onchip_bytes == cap and cost.tiles == 4  # 128 x 128 blocks
        assert cost.blocks_per_unit == 1  # 112 registers x 512 threads
    fp32 = AnalyticalCostModel(_matmul(256, 256, 256, name="f"), tf.load_target("a100"))
    assert fp32.group_cost([0]).onchip_bytes == 48 * 1024
