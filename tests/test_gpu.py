"""GPU targets without a GPU: CUDA kernels compiled by nvcc and resource-checked, the
planner's register / shared-memory estimates against ptxas, tensor cores in the SASS,
MI250X schedules checked in TIR, and `compile --target mi250x` without ROCm."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.embedded import build_embedded_model
from tvm_fusion.gpu import (GpuLimits, build_cuda_kernels, check_kernel, check_schedule,
                            find_nvcc, nvcc_compile, resource_check_postproc, sass)
from tvm_fusion.gpu.cuda import find_cuobjdump
from tvm_fusion.gpu.precision import apply_precision
from tvm_fusion.gpu.rocm import rocm_support
from tvm_fusion.gpu import schedule_and_check
from tvm_fusion.schedules.tir_check import check_launch, device_kernels
from tvm_fusion.plan import AnalyticalCostModel, make_plan
from tvm_fusion.plan.cost import GPU_REGISTER_TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) not installed")


@pytest.fixture(scope="module")
def embedded():
    return tf.import_model(build_embedded_model(), name="embedded")


def _estimates(model, hw):
    graph = tf.build_graph(model.mod)
    plan = make_plan(graph, hw)
    cm = AnalyticalCostModel(graph, hw)
    return plan, {g.name: cm.gpu_resources(g.nodes) for g in plan.groups}


def assert_near_estimate(kernel, est):
    """nvcc's numbers against the planner's, with the tolerance each class states."""
    regs = [e.registers for e in kernel.entries]
    shared = [e.total_shared_bytes for e in kernel.entries]
    threads = [e.threads_per_block for e in kernel.entries]
    what = f"{kernel.name}: estimate {est}, nvcc regs {regs} shared {shared} threads {threads}"
    if est.schedule in ("gemm", "gemm-tensorcore", "reduction", "elementwise"):
        assert len(kernel.entries) == est.kernels == 1, what
        assert threads == [est.threads_per_block], what
    if est.schedule in ("gemm", "gemm-tensorcore"):  # the tile arithmetic is exact
        assert shared == [est.shared_bytes], what
        assert abs(regs[0] - est.registers_per_thread) <= GPU_REGISTER_TOLERANCE, what
    elif est.schedule == "reduction":  # per-warp staging: an upper bound
        assert 0 < shared[0] <= est.shared_bytes, what
        assert abs(regs[0] - est.registers_per_thread) <= GPU_REGISTER_TOLERANCE, what
    else:  # elementwise / split: plain loops, register estimate is an upper bound
        assert len(kernel.entries) == est.kernels, what
        assert max(regs) <= est.registers_per_thread and max(shared) == 0, what


@needs_nvcc
def test_nvcc_report_parsed_from_a_real_compile(tmp_path):
    src = r"""
extern "C" __global__ void __launch_bounds__(128) probe(float* __restrict__ a) {
  __shared__ float buf[1024];
  for (int i = threadIdx.x; i < 1024; i += 128) buf[i] = a[i];
  __syncthreads();
  a[threadIdx.x] = buf[(threadIdx.x * 7 + 3) % 1024];
}
"""
    (entry,), cubin = nvcc_compile(src, "sm_80", workdir=tmp_path, name="probe")
    assert (entry.entry, entry.arch, entry.shared_bytes) == ("probe", "sm_80", 4096)
    assert entry.threads_per_block == 128 and 1 <= entry.registers <= 32
    assert entry.spill_stores == entry.spill_loads == 0 and cubin[:4] == b"\x7fELF"


@needs_nvcc
@pytest.mark.parametrize("target,arch", [("a100", "sm_80"), ("h100", "sm_90")])
def test_embedded_kernels_compile_within_limits_and_near_planner(embedded, target, arch):
    hw = tf.load_target(target)
    plan, est = _estimates(embedded, hw)
    kernels = build_cuda_kernels(embedded, hw, plan=plan)
    assert {k.name for k in kernels} == {g.name for g in plan.groups}
    limits = GpuLimits.from_target(hw)
    for k in kernels:
        assert k.entries and all(e.arch == arch for e in k.entries), k.name
        assert not k.violations, k.violations
        for e in k.entries:
            assert e.registers <= limits.registers_per_thread
            assert e.registers_per_block <= limits.registers_per_block
            assert e.shared_bytes <= limits.shared_bytes_per_block
            assert e.spill_stores == e.spill_loads == 0, e
        assert_near_estimate(k, est[k.name])
    # the conv group is dlight's tiled Matmul: the tile arithmetic gives 6912 B exactly
    conv = next(k for k in kernels if k.name.startswith("fused_conv2d_"))
    assert est[conv.name].schedule == "gemm" and conv.shared_bytes == 6912


def _gemm_model(m=128, k=256, n=256):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype("float32"), "w"),
             numpy_helper.from_array(rng.standard_normal(n).astype("float32"), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"]),
             helper.make_node("Relu", ["y"], ["out"])]
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, m, n])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return tf.import_model(model, name="gemm")


@needs_nvcc
@pytest.mark.parametrize("target,arch", [("a100", "sm_80"), ("h100", "sm_90")])
def test_fp16_gemm_runs_on_tensor_cores(tmp_path, target, arch):
    hw = tf.load_target(target)
    model = apply_precision(_gemm_model(), "fp16")
    plan, est = _estimates(model, hw)
    kernels = build_cuda_kernels(model, hw, plan=plan, workdir=tmp_path)
    gemm = [k for k in kernels if est[k.name].schedule == "gemm-tensorcore"]
    assert len(gemm) == 1, {k.name: est[k.name].schedule for k in kernels}
    (k,) = gemm
    assert "nvcuda::wmma" in k.source and not k.violations
    # 72 KB of dynamic shared memory: above the 48 KB static limit, within the opt-in
    (e,) = k.entries
    assert e.dynamic_shared_bytes == 73728 and e.shared_bytes <= 49152
    assert_near_estimate(k, est[k.name])
    # the planner prices the GEMM at the fp16 tensor-core peak, not the fp32 SIMT one
    graph = tf.build_graph(model.mod)
    cm = AnalyticalCostModel(graph, hw)
    (mm,) = [n for n in graph.nodes if n.kind == "gemm"]
    assert cm.operand_dtype(mm.id) == "float16"
    assert cm.group_cost([mm.id]).compute_us == pytest.approx(
        mm.flops / hw.peak_flops["fp16_matrix"] * 1e6)
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump "
                    "nvidia-cuda-nvdisasm): SASS not checked")
    text = sass((tmp_path / f"{k.name}.cubin").read_bytes())
    assert re.search(r"\bHMMA\.16816\.F32\b", text), text[:2000]


@needs_nvcc
def test_over_limit_schedules_are_rejected_before_measurement(embedded):
    hw = tf.load_target("a100")
    graph = tf.build_graph(embedded.mod)
    fused = tf.apply_plan(graph, make_plan(graph, hw))
    conv = fused["fused_conv2d_add_relu"]
    from tvm_fusion.gpu.sample import sample_schedules

    (ok,) = sample_schedules(conv, hw, count=1, seed=0)
    assert check_schedule(ok.mod["main"], hw) == []
    # a fake tighter register budget: the same kernel is rejected, saying why
    tight = dataclasses.replace(GpuLimits.from_target(hw), registers_per_thread=24)
    (msg,) = check_schedule(ok.mod["main"], hw, limits=tight)
    assert re.search(r"\d+ registers per thread, limit 24", msg) and "a100" in msg
    # as a MetaSchedule postprocessor the check drops candidates before any builder
    rejected: list = []
    post = resource_check_postproc(hw, limits=tight, rejected=rejected)
    assert sample_schedules(conv, hw, count=1, seed=0, extra_postprocs=[post],
                            max_draws=8) == []
    assert rejected and all("limit 24" in m[0] for m in rejected)


def _elementwise(n, threads, *, shared=0, vec=1):
    """B = 2 * A bound to ``threads`` threads; ``shared`` floats staged per block."""
    from tvm import s_tir, te

    a = te.placeholder((n,), "float32", name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    blk = sch.get_sblock("B")
    (i,) = sch.get_loops(blk)
    if shared:
        bx, rest = sch.split(i, [None, shared])
        sch.bind(bx, "blockIdx.x")
        cache = sch.cache_read(blk, 0, "shared")
        sch.compute_at(cache, bx)
        tx, _ = sch.split(rest, [threads, None])
        sch.bind(tx, "threadIdx.x")
        _, ctx = sch.split(sch.get_loops(cache)[-1], [None, threads])
        sch.bind(ctx, "threadIdx.x")
    else:
        bx, tx, v = sch.split(i, [None, threads, vec])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if vec > 1:
            sch.vectorize(v)
    return sch.mod["main"]


def _violations(func, hw):
    return [v for k in device_kernels(func, hw.tvm_target(), "k") for v in check_launch(k, hw)]


def test_mi250x_tir_checks():
    hw = tf.load_target("mi250x")
    assert _violations(_elementwise(4096, 256, vec=4), hw) == []
    assert _violations(_elementwise(1 << 16, 256, shared=8192), hw) == []  # 32 KB of LDS
    (msg,) = _violations(_elementwise(4096, 32), hw)
    assert "32 threads per block" in msg and "64-wide wavefront" in msg
    (msg,) = _violations(_elementwise(1 << 16, 256, shared=24576), hw)  # 96 KB
    assert "98304 bytes of static LDS" in msg and "limit 65536" in msg
    (msg,) = _violations(_elementwise(4096, 64, vec=8), hw)
    assert "256-bit vector" in msg and "128-bit" in msg
    # a100's warp is 32 wide: the 32-thread block is fine there, 96 KB static is not
    a100 = tf.load_target("a100")
    assert _violations(_elementwise(4096, 32), a100) == []
    assert "limit 49152" in _violations(_elementwise(1 << 16, 256, shared=24576), a100)[0]


def test_mi250x_default_schedules_of_the_embedded_model_pass(embedded):
    mod, result = schedule_and_check(embedded, "mi250x")
    graph = tf.build_graph(embedded.mod)
    assert set(result) == {g.name for g in make_plan(graph, tf.load_target("mi250x")).groups}
    assert all(v == [] for v in result.values()), result
    threads = [k.threads_per_block for name in result for k in device_kernels(
        mod[name], tf.load_target("mi250x").tvm_target(), name)]
    assert threads and all(t % 64 == 0 and t <= 1024 for t in threads)


def _cli(*args, timeout: int = 600):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tvm_fusion", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_compile_mi250x_without_the_toolchain_says_what_is_missing(tmp_path, monkeypatch,
                                                                    capsys):
    # a machine without Debian's rocm-device-libs and lld-19 (nor ROCm): hide them
    from tvm_fusion import cli
    from tvm_fusion.gpu import amdgpu

    if rocm_support().rocm_path:
        pytest.skip("this machine has a ROCm installation")
    monkeypatch.setattr(amdgpu, "find_toolchain",
                        lambda: amdgpu.RocmToolchain(bitcode_dir=None, lld=None))
    code = cli.main(["compile", "embedded", "--target", "mi250x", "-o", str(tmp_path / "m.so")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cannot build for mi250x" in err and "apt-get install rocm-device-libs lld-19" in err
    assert "ROCm installation" in err and "MISSING" in err and "USE_ROCM=ON" in err
    assert "Traceback" not in err and not (tmp_path / "m.so").exists()


def test_tune_for_a_gpu_this_machine_lacks_is_refused_before_tuning(tmp_path):
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a CUDA GPU")
    proc = _cli("tune", "embedded", "--target", "a100", "--trials", "4", "--logs", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "this machine has none" in proc.stderr and "--dry-run" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("database_tuning_record.json"))  # nothing measured


def _mlp_head(path: Path) -> Path:
    """The embedded model's MLP head alone (Gemm-SiLU, Gemm, Softmax: 3 kernels, not 7).

    A dry run searches every kernel with the cost model, so the conv kernels cost most of
    it; the head keeps a pick the limits accept (Gemm-SiLU, Softmax) and one they turn
    down (the 10-wide Gemm: 10 threads per block is not a multiple of a warp).
    """
    import onnx

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 16)).astype("float32") / 4, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(64).astype("float32") / 10, "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((10, 64)).astype("float32") / 8, "w2")
    b2 = numpy_helper.from_array(rng.standard_normal(10).astype("float32") / 10, "b2")
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Mul", ["h", "s"], ["silu"]),
             helper.make_node("Gemm", ["silu", "w2", "b2"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(
        nodes, "mlp_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])], [w1, b1, w2, b2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


@needs_nvcc
def test_dry_run_picks_limit_checked_schedules_marked_unmeasured(tmp_path):
    """``tune --dry-run`` for a GPU this machine lacks: cost-model picks, nvcc-checked,
    marked predicted and unmeasured in the log; ``compile`` applies them and says so."""
    import json

    import tvm

    from tvm_fusion.logs.logdb import PREDICTED_RUN_S
    from tvm_fusion.logs.dirs import open_database

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a CUDA GPU: a dry run would verify there")
    head = _mlp_head(tmp_path / "head.onnx")
    logs = tmp_path / "logs"
    proc = _cli("tune", head, "--target", "a100", "--dry-run", "--logs", logs)
    assert proc.returncode == 2 and "none ships for 'a100'" in proc.stderr  # no model
    model = ROOT / "tuning_logs" / "x86_zen4" / "costmodel.json"
    proc = _cli("tune", head, "--target", "a100", "--dry-run", "--logs", logs,
                "--quiet", "--cost-model", model, timeout=1800)  # ~20 s on a quiet machine
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not run: no device here" in proc.stdout
    tdir = logs / "a100"
    (entry,) = json.loads((tdir / "manifest.json").read_text())["models"].values()
    predicted = entry["predicted"]
    assert len(predicted) >= 2, proc.stdout
    for info in predicted.values():
        assert info["measured"] is False and info["verified"] is False
        assert info["checked"] == "tir+nvcc" and 1 <= info["rank"] <= info["candidates"]
    db = open_database(tdir, create=False)
    records = db.get_all_tuning_records()
    assert len(records) == len(predicted)
    assert all([float(s) for s in r.run_secs] == [PREDICTED_RUN_S] for r in records)
    # the picks are what the kernels are built from, and every one is within A100's limits
    plan = tf.FusionPlan.from_json(entry["plan"])
    imported = tf.import_model(str(head))
    kernels = {k.name: k for k in build_cuda_kernels(imported, "a100", plan=plan, database=db)}
    for name in predicted:
        assert kernels[name].schedule == "record" and not kernels[name].violations, name
    # candidates turned down are kept with their reason
    rejected = [json.loads(ln) for ln in (tdir / "rejected.jsonl").read_text().splitlines()]
    assert rejected  # the 10-wide Gemm's picks bind 10 threads
    for row in rejected:
        assert row["source"] == "cost-model pick" and row["error"]
    proc = _cli("logs", "show", logs)  # the placeholder time is never shown as one
    assert f"({len(predicted)} best picked by --dry-run, not measured)" in proc.stdout
    assert "100000000.00" not in proc.stdout
    out = tmp_path / "m.so"
    proc = _cli("compile", head, "--target", "a100", "--logs", logs, "-o", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(predicted)} kernels use a schedule picked by the cost model" in proc.stdout
    assert all(name in proc.stdout for name in predicted)
    info = json.loads(out.with_name("m.so.json").read_text())
    assert sorted(info["predicted_unmeasured"]) == sorted(predicted)
    assert not set(predicted) & set(info["untuned"])  # the picks were applied
    assert all(info["schedules"][n] == "predicted" for n in predicted)  # not "measured"


def test_tune_needs_trials_unless_dry_run(tmp_path):
    proc = _cli("tune", "embedded", "--logs", tmp_path)
    assert proc.returncode == 2 and "--trials N is required" in proc.stderr


@needs_nvcc
def test_compile_a100_builds_cuda_kernels_and_fp16_needs_a_gpu_target(tmp_path):
    out = tmp_path / "m.so"
    proc = _cli("compile", "embedded", "--target", "a100", "-o", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = tf.plan_fusion(tf.build_graph(
        tf.import_model(build_embedded_model(), name="embedded").mod), "a100")
    assert out.exists() and f"({len(plan.groups)} kernels" in proc.stdout
    proc = _cli("plan", "embedded", "--target", "host", "--precision", "fp16")
    assert proc.returncode == 2 and "for GPU targets" in proc.stderr


def test_check_kernel_messages_name_resource_use_and_limit():
    from tvm_fusion.gpu import KernelResources

    hw = tf.load_target("h100")
    big = KernelResources(entry="k", arch="sm_90", registers=128, shared_bytes=1024,
                          spill_stores=0, spill_loads=0, stack_bytes=0,
                          threads_per_block=1024, dynamic_shared_bytes=240 * 1024)
    msgs = check_kernel(big, GpuLimits.from_target(hw))
    assert any("131072 registers per block, limit 65536" in m for m in msgs), msgs
    assert any("dynamic bytes of shared memory per block, limit 232448" in m for m in msgs)
    ok = dataclasses.replace(big, registers=64, dynamic_shared_bytes=0)
    assert check_kernel(ok, GpuLimits.from_target(hw)) == []


def test_predict_best_picks_by_the_cost_model_alone(embedded):
    """Cost-model-only picking (no GPU, no measurement) goes by the model passed in."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import PyCostModel

    from tvm_fusion.gpu.sample import predict_best

    hw = tf.load_target("a100")
    target = hw.tvm_target()

    def shared(sch):
        return sum(k.shared_bytes for k in device_kernels(sch.mod["main"], target, "k"))

    @derived_object
    class FewestSharedBytes(PyCostModel):  # a stand-in for a trained model's ranking
        def load(self, path):
            pass

        def save(self, path):
            pass

        def update(self, context, candidates, results):
            pass

        def predict(self, context, candidates):
            return np.array([-shared(c.sch) for c in candidates], dtype="float64")

    graph = tf.build_graph(embedded.mod)
    fused = tf.apply_plan(graph, make_plan(graph, hw))
    sch, score, scores = predict_best(fused["fused_conv2d_add_relu"],
                                      hw, FewestSharedBytes(), count=4, seed=0)
    assert len(scores) >= 2 and len(set(scores)) >= 2, scores
    assert score == max(scores) and shared(sch) == -score


@needs_nvcc
def test_fp16_embedded_builds_even_where_a_dlight_rule_crashes(embedded):
    # dlight's Matmul rule asserts on the fp16 conv + cast epilogue; the next rule takes it
    hw = tf.load_target("a100")
    kernels = build_cuda_kernels(apply_precision(embedded, "fp16"), hw)
    conv = [k for k in kernels if k.name.startswith("fused_conv2d_")]
    assert len(conv) == 1 and conv[0].entries
    assert all(k.entries and not k.violations for k in kernels), [k.violations for k in kernels]


def test_h200_script_is_ready_to_run():
    """The prepared H200 run: its device command fits the tool, its table renders rows
    and errors alike (the run itself needs the GPU machine)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("h200", ROOT / "benchmarks" / "h200.py")
    h200 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h200)
    cmd = h200.device_command()
    assert len(cmd) < 2000 and "--out $OUT" in cmd and ".whl/tvm.tar.xz" in cmd
    rows = [{"model": "embedded", "system": "torch eager", "ms": 0.05, "rel_err": 0.0},
            {"model": "embedded", "system": "tvm-fusion tuned", "error": "RuntimeError: x"}]
    table = h200.results_table(rows, {"gpu": "NVIDIA H200", "torch": "2.11", "tvm": "0.27"})
    assert "| embedded | torch eager | 0.0500 |" in table
    assert "| embedded | tvm-fusion tuned | - | - | RuntimeError: x |" in table


def test_fp16_converts_a_cnn_with_both_forms_of_clip_and_matches_onnxruntime(tmp_path):
    """ReLU6 and HardSwish reach Relax as ``call_tir`` of TOPI's maximum / minimum and as
    ``R.clip`` with scalar bounds; Relax's ToMixedPrecision stops on both. Converted, the
    convolutions take fp16 operands, and the build agrees with ONNX Runtime's fp32 run to
    fp16 accuracy."""
    import onnx_cases as oc
    from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime

    proto = oc.relu6_pointwise(channels=32, out_channels=32)
    model = apply_precision(tf.import_model(proto), "fp16")
    script = model.mod["main"].script()
    assert "R.clip" not in script and "call_tir" not in script
    assert script.count('R.astype(') >= 2 and 'dtype="float16"' in script
    inputs = random_inputs(model.inputs, seed=0)
    got = tf.load_module(tf.compile_model(model, "host").export(tmp_path / "m.so"))(*inputs)
    err = max_rel_error(got[0], run_onnxruntime(proto, inputs)[0])
    assert 0 < err < 1e-2  # fp16 operands: not fp32-exact, within fp16's rounding


@needs_nvcc
def test_a100_int8_gemm_builds_with_nvcc_and_uses_dp4a(tmp_path):
    """An integer GEMM (MatMulInteger, u8 x s8 -> i32) for a100: its default schedule
    (schedules/dp4a.py) tensorizes the packed weight's 4-wide K tile with DP4A; nvcc compiles
    it within the limits and the PTX has the dp4a instruction."""
    import onnx_cases as oc

    model = tf.import_model(oc.u8_matmul_integer(rows=128, k=256, n=128))
    (k,) = build_cuda_kernels(model, tf.load_target("a100"), workdir=tmp_path)
    assert "__dp4a" in k.source and not k.violations
    src = tmp_path / "int8.cu"
    src.write_text(k.source)
    ptx = tmp_path / "int8.ptx"
    subprocess.run([find_nvcc(), "-arch=sm_80", "-ptx", "-o", str(ptx), str(src)],
                   check=True, capture_output=True)
    assert re.search(r"\bdp4a\.u32\.s32\b", ptx.read_text())
