"""The CPU compute term's efficiency (plan/cpu_efficiency.py): hand-computable prices,
the target file's field, the fit on measured records, and calibrate --logs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion import cli as tf_cli
from tvm_fusion import targets
from tvm_fusion.costmodel.efficiency_fit import (
    efficiency_terms, fit_cpu_efficiency, with_cpu_efficiency)
from tvm_fusion.costmodel.group_data import KernelRecord, vm_call_us
from tvm_fusion.data import shipped_logs_dir
from tvm_fusion.errors import TargetError
from tvm_fusion.plan import AnalyticalCostModel
from tvm_fusion.plan.cpu_efficiency import DEFAULT_CPU_EFFICIENCY, CpuEfficiency, cpu_efficiency

from test_planner import _model


def _w(name, shape, seed):
    return numpy_helper.from_array(
        np.random.default_rng(seed).standard_normal(shape).astype("float32"), name)


@pytest.fixture(scope="module")
def graph():
    """A 64x256 @ 256x128 matmul (node 0), a 1x256 @ 256x16 GEMV, a 3x3 depthwise
    conv over 32 channels and a 3x3 conv 32 -> 32 channels (24 x 24 pixels), a ReLU."""
    nodes = [helper.make_node("MatMul", ["a", "wa"], ["ya"]),
             helper.make_node("MatMul", ["v", "wv"], ["yv"]),
             helper.make_node("Conv", ["x", "wd"], ["yd"], group=32, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["yd", "wc"], ["yc"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["yc"], ["y"])]
    inits = [_w("wa", [256, 128], 0), _w("wv", [256, 16], 1), _w("wd", [32, 1, 3, 3], 2),
             _w("wc", [32, 32, 3, 3], 3)]
    model = _model(nodes, [("a", [64, 256]), ("v", [1, 256]), ("x", [1, 32, 24, 24])],
                   [("ya", [64, 128]), ("yv", [1, 16]), ("y", [1, 32, 24, 24])],
                   inits, name="eff", simplify=False)
    return tf.build_graph(model.mod)


def _node(graph, op, nth=0):
    return [n for n in graph.nodes if n.op.startswith(op)][nth]


def test_cpu_flops_run_at_the_share_of_peak_a_tuned_kernel_reaches(graph):
    hw = tf.load_target("x86_zen4")  # its file's shares, fitted on this machine's logs
    cm = AnalyticalCostModel(graph, hw)
    peak, eff = hw.peak_fp32_flops, cpu_efficiency(hw)
    assert eff != DEFAULT_CPU_EFFICIENCY and cpu_efficiency(
        tf.load_target("x86_avx512")) == DEFAULT_CPU_EFFICIENCY  # no shares: the default
    mm, gemv = _node(graph, "matmul"), _node(graph, "matmul", 1)
    dw, conv = _node(graph, "conv2d"), _node(graph, "conv2d", 1)
    # 64 x 128 outputs: 8 vectors of 16 lanes x 64 rows, a full tile (28 accumulators)
    assert cm.group_cost([mm.id]).compute_us == pytest.approx(mm.flops / (peak * eff.gemm) * 1e6)
    # a GEMV: one row of one vector, 1 accumulator of the 8 the FMA pipes need
    assert cm.group_cost([gemv.id]).compute_us == pytest.approx(
        gemv.flops / (peak * eff.gemm / 8) * 1e6)
    # the depthwise conv reduces over its 3x3 window only; W = 24 fills 24 of the 32
    # lanes of two vectors
    assert cm.group_cost([dw.id]).compute_us == pytest.approx(
        dw.flops / (peak * eff.depthwise * 24 / 32) * 1e6)
    # the 3x3 conv runs in NCHW (TOPI's conv2d_nchw): its share is conv_nchw
    assert cm.group_cost([conv.id]).compute_us == pytest.approx(
        conv.flops / (peak * eff.nchw_conv * 24 / 32) * 1e6)
    no_nchw = with_cpu_efficiency(hw, CpuEfficiency(gemm=0.5, depthwise=0.1, vector=0.2))
    assert AnalyticalCostModel(graph, no_nchw).group_cost([conv.id]).compute_us == \
        pytest.approx(conv.flops / (peak * 0.5 * 24 / 32) * 1e6)  # not fitted: gemm's
    nchw = with_cpu_efficiency(hw, CpuEfficiency(gemm=0.5, depthwise=0.1, vector=0.2,
                                                 conv_nchw=0.25))
    assert AnalyticalCostModel(graph, nchw).group_cost([conv.id]).compute_us == \
        pytest.approx(conv.flops / (peak * 0.25 * 24 / 32) * 1e6)
    assert AnalyticalCostModel(graph, nchw).group_cost([mm.id]).compute_us == \
        pytest.approx(mm.flops / (peak * 0.5) * 1e6)
    # the shares of the target file, where it has them; every share 1 is the peak model
    ones = with_cpu_efficiency(hw, CpuEfficiency(gemm=1, depthwise=1, vector=1,
                                                 accumulators=1))
    assert AnalyticalCostModel(graph, ones).group_cost([mm.id]).compute_us == pytest.approx(
        mm.flops / peak * 1e6)
    half = with_cpu_efficiency(hw, CpuEfficiency(gemm=0.5, depthwise=0.1, vector=0.2))
    assert AnalyticalCostModel(graph, half).group_cost([dw.id]).compute_us == pytest.approx(
        dw.flops / (peak * 0.1 * 24 / 32) * 1e6)


def _memory_case():
    """x[2048, 2048] (16 MB): a copy, a row mean and a tiny add of y[4, 16]."""
    nodes = [helper.make_node("Identity", ["x"], ["c0"]),
             helper.make_node("Add", ["c0", "x"], ["big"]),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Add", ["y", "y"], ["small"])]
    model = _model(nodes, [("x", [2048, 2048]), ("y", [4, 16])],
                   [("big", [2048, 2048]), ("m", [2048, 1]), ("small", [4, 16])],
                   name="mem", simplify=False)
    return tf.build_graph(model.mod)


def test_cpu_bytes_within_the_llc_move_at_the_cache_rate_and_small_kernels_run_serial():
    graph = _memory_case()
    hw = tf.load_target("x86_zen4")
    cm = AnalyticalCostModel(graph, hw)
    big = _node(graph, "add")
    small = _node(graph, "add", 1)
    # 32 MB in + 16 MB out: the LLC's 32 MB at the copy rate, the other 16 MB from DRAM
    # (a 25 MB concatenate ran at 131 GB/s, the calibrated copy rate, not 31 GB/s)
    cost = cm.group_cost([big.id])
    over = 48 * (1 << 20) - hw.llc_bytes
    assert cost.memory_us == pytest.approx(
        over / (hw.dram_bandwidth_gbs * 1e3) + hw.llc_bytes / (hw.cache_bandwidth_gbs * 1e3))
    assert cost.launch_us == pytest.approx(hw.call_overhead_us + hw.launch_overhead_us)
    # 64 elements: one core does it faster than the pool forks and joins
    tiny = cm.group_cost([small.id])
    assert tiny.launch_us == pytest.approx(hw.call_overhead_us)
    assert tiny.total_us < hw.call_overhead_us + hw.launch_overhead_us
    # a reduction-led kernel moves its bytes at the fitted share of the copy rate
    mean = _node(graph, "mean")
    shares = dict(gemm=0.5, depthwise=0.5, vector=0.5)
    plain = AnalyticalCostModel(graph, with_cpu_efficiency(hw, CpuEfficiency(**shares)))
    slow = AnalyticalCostModel(graph, with_cpu_efficiency(
        hw, CpuEfficiency(**shares, reduction=0.25)))
    assert slow.group_cost([mean.id]).memory_us == pytest.approx(
        4 * plain.group_cost([mean.id]).memory_us)
    assert slow.group_cost([big.id]).memory_us == plain.group_cost([big.id]).memory_us


def _access_case():
    """How kernels read x[1, 32, 24, 24]: a global mean over H, W (along the innermost
    axis), a 2x2 max pool and a sum over C (vectors along the kept W), a transpose of H
    and W (across the innermost axis) and one of N and C (W stays innermost), and a 1x1
    conv whose result is transposed (a GEMM with a strided epilogue)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["gap"], axes=[2, 3], keepdims=1),
             helper.make_node("MaxPool", ["x"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("ReduceSum", ["x", "ax1"], ["csum"], keepdims=1),
             helper.make_node("Transpose", ["x"], ["hw"], perm=[0, 1, 3, 2]),
             helper.make_node("Transpose", ["x"], ["nc"], perm=[1, 0, 2, 3]),
             helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 3, 1])]
    inits = [_w("w", [32, 32, 1, 1], 4),
             numpy_helper.from_array(np.array([1], dtype="int64"), "ax1")]
    model = _model(nodes, [("x", [1, 32, 24, 24])],
                   [("gap", [1, 32, 1, 1]), ("pool", [1, 32, 12, 12]), ("csum", [1, 1, 24, 24]),
                    ("hw", [1, 32, 24, 24]), ("nc", [32, 1, 24, 24]), ("ct", [1, 24, 24, 32])],
                   inits, name="access", simplify=False)
    return tf.build_graph(model.mod)


def test_how_a_kernel_reads_picks_its_share_of_the_copy_rate():
    from tvm_fusion.plan.op_info import graph_info
    graph = _access_case()
    infos = graph_info(graph)
    gap, pool, csum = _node(graph, "mean"), _node(graph, "max_pool"), _node(graph, "sum")
    hw_t, nc_t, ct = (_node(graph, "transpose", k) for k in range(3))
    conv = _node(graph, "conv2d")
    assert infos[gap.id].horizontal
    assert not infos[pool.id].horizontal and not infos[csum.id].horizontal
    assert infos[hw_t.id].strided and infos[ct.id].strided and not infos[nc_t.id].strided
    hw = tf.load_target("x86_zen4")
    shares = dict(gemm=0.5, depthwise=0.5, vector=0.5)
    plain = AnalyticalCostModel(graph, with_cpu_efficiency(hw, CpuEfficiency(**shares)))
    cm = AnalyticalCostModel(graph, with_cpu_efficiency(hw, CpuEfficiency(
        **shares, reduction=0.25, reduction_vector=0.5, strided=0.4)))
    kinds = {"reduction": [gap.id], "reduction_vector": [pool.id], None: [nc_t.id],
             "strided": [hw_t.id]}
    for kind, group in kinds.items():
        assert cm.memory_kind(group) == kind
    assert cm.memory_kind([conv.id]) is None and cm.memory_kind([conv.id, ct.id]) == "strided"
    for group, share in (([gap.id], 0.25), ([pool.id], 0.5), ([csum.id], 0.5),
                         ([hw_t.id], 0.4), ([nc_t.id], 1.0)):
        assert cm.group_cost(group).memory_us == pytest.approx(
            plain.group_cost(group).memory_us / share), group
    # a GEMM whose epilogue transposes runs its FLOPs at the share too
    fused = [conv.id, ct.id]
    assert cm.group_cost(fused).compute_us == pytest.approx(
        plain.group_cost(fused).compute_us / 0.4)
    assert cm.group_cost([conv.id]).compute_us == plain.group_cost([conv.id]).compute_us


def test_the_fit_recovers_the_bandwidth_shares():
    # FLOPs far faster than bytes, so every kernel is memory-bound and each bandwidth
    # share shows in the times (a free vector share could otherwise absorb them)
    import dataclasses
    graph = _access_case()
    zen4 = tf.load_target("x86_zen4")
    hw = dataclasses.replace(zen4, peak_flops={k: v * 1e4 for k, v in zen4.peak_flops.items()})
    shares = dict(gemm=0.5, depthwise=0.5, vector=0.5)
    truth = CpuEfficiency(**shares, reduction=0.25, reduction_vector=0.6, strided=0.4)
    cm = AnalyticalCostModel(graph, with_cpu_efficiency(hw, truth))
    base = AnalyticalCostModel(graph, with_cpu_efficiency(hw, CpuEfficiency(**shares)))
    groups = [[_node(graph, op).id] for op in ("mean", "max_pool", "sum")] + \
        [[_node(graph, "transpose").id]]
    recs = [KernelRecord(model="access", kernel=str(g), nodes=tuple(g), cost_model=base,
                         logs="", meas_us=cm.group_cost(g).total_us - vm_call_us(hw))
            for g in groups]
    fit = fit_cpu_efficiency(efficiency_terms(recs))
    for key in ("reduction", "reduction_vector", "strided"):
        assert getattr(fit, key) == pytest.approx(getattr(truth, key), rel=0.04), key


def test_a_gemm_fused_into_a_softmax_of_its_rows_rereads_a_weight_beyond_l2():
    """A classifier head: x[40, 120] @ w[120, N], softmax over N. Fused, the GEMM runs
    row by row, and a weight larger than one core's L2 (N = 4096: 1.9 MiB) streams
    through the LLC once per row; one that fits (N = 1024: 480 KiB) stays."""
    hw = tf.load_target("x86_zen4")
    for n, reread in ((4096, True), (1024, False)):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
                 helper.make_node("Softmax", ["y"], ["p"], axis=-1)]
        model = _model(nodes, [("x", [40, 120])], [("p", [40, n])], [_w("w", [120, n], 5)],
                       name=f"head{n}", simplify=False)
        graph = tf.build_graph(model.mod)
        cm = AnalyticalCostModel(graph, hw)
        mm, sm = _node(graph, "matmul"), _node(graph, "softmax")
        fused = cm.group_cost([mm.id, sm.id])
        apart = [cm.group_cost([mm.id]), cm.group_cost([sm.id])]
        weight = 120 * n * 4
        extra = 39 * weight / (hw.cache_bandwidth_gbs * 1e3)
        if reread:
            assert fused.memory_us >= extra
            assert fused.total_us > sum(c.total_us for c in apart)  # kept apart
        else:
            assert fused.memory_us < extra / 4


def test_pow_by_a_constant_llvm_folds_is_no_libm_call():
    from tvm_fusion.plan.op_info import CALL_FLOPS, graph_info
    two = helper.make_tensor("two", 1, [], [2.0])
    three = helper.make_tensor("three", 1, [], [3.0])
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("Pow", ["x", "three"], ["cube"])]
    model = _model(nodes, [("x", [64, 64])], [("sq", [64, 64]), ("cube", [64, 64])],
                   [two, three], name="pow", simplify=False)
    graph = tf.build_graph(model.mod)
    sq, cube = (graph_info(graph)[_node(graph, "power", k).id] for k in (0, 1))
    # pow(x, 2.0) compiles to x * x (measured as fast as a copy); pow(x, 3.0) calls powf
    assert sq.transcendental == 0
    assert cube.transcendental == (CALL_FLOPS["pow"] - 1) * 64 * 64


def test_gpus_keep_their_terms(graph):
    a100 = tf.load_target("a100")
    mm = _node(graph, "matmul")
    cost = AnalyticalCostModel(graph, a100).group_cost([mm.id])
    assert cost.compute_us == pytest.approx(mm.flops / a100.peak_fp32_flops * 1e6)


def test_cpu_efficiency_in_a_target_file_round_trips_and_bad_values_name_the_key():
    doc = tf.load_target("x86_zen4").to_json_dict()
    shipped = tf.load_target("x86_zen4").hardware_hash
    doc["cpu_efficiency"] = {"value": {"gemm": 0.4, "depthwise": 0.2, "vector": 0.05,
                                       "accumulators": 8}, "source": "fitted (test)"}
    hw = targets.target_from_dict(doc)
    assert dict(hw.cpu_efficiency)["gemm"] == 0.4
    # fitted shares are a calibration of the same hardware: its logs still apply
    assert hw.hardware_hash == shipped and hw.values_hash != tf.load_target("x86_zen4").values_hash
    assert targets.target_from_dict(hw.to_json_dict()).hardware_hash == hw.hardware_hash
    doc["cpu_efficiency"]["value"]["gemm"] = 1.5
    with pytest.raises(TargetError, match=r"cpu_efficiency.gemm' must be a number in \(0, 1\]"):
        targets.target_from_dict(doc)
    del doc["cpu_efficiency"]["value"]["gemm"]
    with pytest.raises(TargetError, match="with the keys gemm, depthwise, vector, accumulators"):
        targets.target_from_dict(doc)


def test_the_fit_recovers_the_shares_that_made_the_times(graph):
    # memory far faster than compute, so every kernel is compute-bound and each share
    # shows in the times (where bytes bound a kernel, its share cannot be seen)
    import dataclasses
    hw = dataclasses.replace(tf.load_target("x86_zen4"), dram_bandwidth_gbs=1e4,
                             cache_bandwidth_gbs=1e5)
    truth = CpuEfficiency(gemm=0.4, depthwise=0.2, vector=0.05, conv_nchw=0.25)
    cm = AnalyticalCostModel(graph, with_cpu_efficiency(hw, truth))
    base = AnalyticalCostModel(graph, hw)
    groups = [[n.id] for n in graph.nodes] + [[_node(graph, "conv2d", 1).id, graph.nodes[-1].id]]
    recs = [KernelRecord(model="eff", kernel=str(g), nodes=tuple(g), cost_model=base, logs="",
                         meas_us=cm.group_cost(g).total_us - vm_call_us(hw))
            for g in groups]
    fit = fit_cpu_efficiency(efficiency_terms(recs))
    for key in ("gemm", "depthwise", "vector", "conv_nchw"):  # the grid's step is 3.4%
        assert getattr(fit, key) == pytest.approx(getattr(truth, key), rel=0.04), key


def test_calibrate_fits_the_shares_from_logs_without_probing(tmp_path, capsys):
    out = tmp_path / "zen4_fit.json"
    logs = shipped_logs_dir() / "x86_zen4"
    assert tf_cli.main(["calibrate", "--target", "x86_zen4", "--no-probe", "--logs", str(logs),
                        "--name", "zen4_fit", "-o", str(out)]) == 0
    assert "cpu_efficiency: gemm" in capsys.readouterr().out
    hw = tf.load_target(out)
    # the embedded model's convs run in NCHW: their share is fitted too
    assert set(hw.cpu_efficiency) == {"gemm", "depthwise", "vector", "accumulators",
                                      "conv_nchw"}
    assert "fitted by `tvm-fusion calibrate --logs`" in hw.sources["cpu_efficiency"]
    assert "embedded" in hw.sources["cpu_efficiency"]
    assert json.loads(out.read_text())["launch_overhead_us"] == \
        tf.load_target("x86_zen4").to_json_dict()["launch_overhead_us"]
    assert tf_cli.main(["calibrate", "--no-probe", "-o", str(tmp_path / "x.json")]) == 2
    assert "pass --logs DIR" in capsys.readouterr().err
    assert tf_cli.main(["calibrate", "--no-probe", "--logs", str(tmp_path),
                        "-o", str(tmp_path / "y.json")]) == 2
    err = capsys.readouterr().err
    assert "no measured CPU kernel" in err and "tvm-fusion tune" in err
    assert "Traceback" not in err


def test_math_calls_cost_their_lowering_not_one_flop():
    """TVM counts an exp or a log as one FLOP; on a CPU a sigmoid costs an exp's
    polynomial and a division, a log a scalar libm call per lane. chars2vec's LSTM
    cells were priced 9-74x under (benchmarks/RESULTS.md run 14)."""
    from tvm_fusion.plan.op_info import CALL_FLOPS, graph_info

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Log", ["s"], ["l"]),
             helper.make_node("Relu", ["l"], ["y"])]
    model = _model(nodes, [("x", [1, 4096])], [("y", [1, 4096])], [], name="math",
                   simplify=False)
    graph = tf.build_graph(model.mod)
    infos = graph_info(graph)
    nid = {n.op: n.id for n in graph.nodes}  # tir_sigmoid, tir_log, relu
    assert infos[nid["tir_sigmoid"]].transcendental == (CALL_FLOPS["sigmoid"] - 1) * 4096
    assert infos[nid["tir_log"]].transcendental == (CALL_FLOPS["log"] - 1) * 4096
    assert infos[nid["relu"]].transcendental == 0
    cpu = AnalyticalCostModel(graph, tf.load_target("x86_zen4"))
    log, relu = nid["tir_log"], nid["relu"]
    assert cpu.group_cost([log]).compute_us > 50 * cpu.group_cost([relu]).compute_us
    gpu = AnalyticalCostModel(graph, tf.load_target("a100"))
    assert gpu.transcendental(log) == 0  # GPUs: special-function units, gpu_terms' job


def test_a_contractions_epilogue_runs_at_its_share_not_the_vector_one():
    """A GELU after a GEMM: fused, its erf polynomial runs on the GEMM's register tile
    (PP-OCRv6's GELU convs ran their erf at about the conv's rate, where the vector
    share priced them 2.3x over); alone, the same op pays the vector share."""
    hw = tf.load_target("x86_zen4")
    eff = cpu_efficiency(hw)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Erf", ["y"], ["e"])]
    model = _model(nodes, [("x", [128, 384])], [("e", [128, 1536])],
                   [_w("w", [384, 1536], 6)], name="gelu", simplify=False)
    graph = tf.build_graph(model.mod)
    cm = AnalyticalCostModel(graph, hw)
    mm, erf = _node(graph, "matmul"), next(n for n in graph.nodes if "erf" in n.op)
    work = erf.flops + cm.transcendental(erf.id)
    assert work > 0
    fused = cm.group_cost([mm.id, erf.id]).compute_us
    alone = cm.group_cost([mm.id]).compute_us
    assert fused - alone == pytest.approx(work / (hw.peak_fp32_flops * eff.gemm) * 1e6)
    assert cm.group_cost([erf.id]).compute_us == pytest.approx(
        work / (hw.peak_fp32_flops * eff.vector) * 1e6)


def test_unit_dims_carry_no_lanes_the_next_dim_out_does():
    """An SE block's 1 x 1 conv on a pooled [1, C, 1, 1] vectorizes along C, not along a
    W of 1 (such convs were predicted up to 11x over); a 2-column GEMV fills 2 lanes."""
    from tvm_fusion.plan.cost import lane_utilisation

    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "wse"], ["se"]),
             helper.make_node("Flatten", ["se"], ["f"]),
             helper.make_node("MatMul", ["f", "wc"], ["y"])]
    model = _model(nodes, [("x", [1, 64, 8, 8])], [("y", [1, 2])],
                   [_w("wse", [32, 64, 1, 1], 7), _w("wc", [32, 2], 8)], name="se",
                   simplify=False)
    graph = tf.build_graph(model.mod)
    hw = tf.load_target("x86_zen4")  # 16 fp32 lanes
    conv, gemv = _node(graph, "conv2d"), _node(graph, "matmul")
    assert list(conv.shape) == [1, 32, 1, 1]
    assert lane_utilisation(hw, conv) == 1.0
    assert lane_utilisation(hw, gemv) == pytest.approx(2 / 16)
    assert lane_utilisation(tf.load_target("a100"), gemv) == 1.0  # GPUs: no lane term


def test_a_short_innermost_dim_pays_for_the_part_vector_it_leaves():
    """A row of 40 outputs fills 40 of the 48 lanes of three vectors, 258 outputs 258 of
    272 (ppocr-rec's [60, 40] convs ran at 48% of peak where their share is 77%)."""
    from tvm_fusion.plan.cost import lane_utilisation

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("MatMul", ["y", "w2"], ["z"])]
    model = _model(nodes, [("x", [3, 258])], [("z", [3, 40])],
                   [_w("w", [258, 258], 9), _w("w2", [258, 40], 10)], name="lanes",
                   simplify=False)
    graph = tf.build_graph(model.mod)
    zen4 = tf.load_target("x86_zen4")
    wide, narrow = sorted((n for n in graph.nodes if n.op.startswith("matmul")),
                          key=lambda n: -int(n.shape[-1]))
    assert lane_utilisation(zen4, narrow) == pytest.approx(40 / 48)
    assert lane_utilisation(zen4, wide) == pytest.approx(258 / 272)
    assert lane_utilisation(tf.load_target("a100"), narrow) == 1.0


def test_a_transpose_of_short_rows_streams_like_a_gather_and_a_long_rows_one_like_a_copy():
    """MiniLM's head merge, [12, 128, 32] -> [128, 12, 32], keeps the innermost axis but
    reads 128-byte rows from 12 places: it moved 31 GB/s against a copy's 133, so it is
    priced at the ``strided`` share. With 64-float rows (256 bytes) the same permutation
    streams; a bias broadcast along rows permutes nothing. As a GEMM's epilogue such a
    transpose costs nothing more (MiniLM: 168 us with its head split, 164 without), so
    there it keeps the GEMM's share."""
    from tvm_fusion.plan.op_info import graph_info

    nodes = [helper.make_node("Transpose", ["a"], ["ta"], perm=[1, 0, 2]),
             helper.make_node("Transpose", ["b"], ["tb"], perm=[1, 0, 2]),
             helper.make_node("Add", ["c", "bias"], ["cb"])]
    model = _model(nodes, [("a", [12, 128, 32]), ("b", [12, 128, 64]), ("c", [12, 128, 32])],
                   [("ta", [128, 12, 32]), ("tb", [128, 12, 64]), ("cb", [12, 128, 32])],
                   [_w("bias", [1, 32], 11)], name="rows", simplify=False)
    graph = tf.build_graph(model.mod)
    infos = graph_info(graph)
    short, long = _node(graph, "transpose"), _node(graph, "transpose", 1)
    assert infos[short.id].short_rows and not infos[long.id].short_rows
    assert not infos[short.id].strided  # its innermost axis stays
    assert not infos[_node(graph, "add").id].short_rows
    cm = AnalyticalCostModel(graph, tf.load_target("x86_zen4"))
    assert cm.memory_kind([short.id]) == "strided" and cm.memory_kind([long.id]) is None
    mm = [helper.make_node("MatMul", ["x", "w"], ["y"]),
          helper.make_node("Reshape", ["y", "shape"], ["r"]),
          helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2])]
    heads = _model(mm, [("x", [128, 384])], [("t", [12, 128, 32])],
                   [_w("w", [384, 384], 12),
                    numpy_helper.from_array(np.array([128, 12, 32], dtype="int64"), "shape")],
                   name="heads", simplify=False)
    g2 = tf.build_graph(heads.mod)
    cm2 = AnalyticalCostModel(g2, tf.load_target("x86_zen4"))
    split = [n.id for n in g2.nodes]
    assert graph_info(g2)[_node(g2, "transpose").id].short_rows
    assert cm2.memory_kind(split) is None  # the GEMM's share, not strided
