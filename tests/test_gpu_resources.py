"""Kernel resources from the real compilers feed the GPU plan (tvm_fusion/gpu/resources.py):
the occupancy rules by hand, gfx90a code objects built and read back, and plans re-made
with what nvcc's ptxas and the AMDGPU backend allocated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.embedded import build_embedded_model
from tvm_fusion.gpu import find_nvcc
from tvm_fusion.gpu.amdgpu import AmdgpuResources, find_toolchain, parse_amdgpu_metadata
from tvm_fusion.gpu.resources import compile_group, plan_with_compiled_resources
from tvm_fusion.schedules.default import default_gpu_schedule
from tvm_fusion.plan import make_plan
from tvm_fusion.plan.gpu_resources import GpuResources
from tvm_fusion.plan.gpu_terms import blocks_per_unit, waves_per_simd

ROOT = Path(__file__).resolve().parents[1]
ROCM = find_toolchain()
needs_rocm = pytest.mark.skipif(bool(ROCM.missing), reason="no gfx90a toolchain here: "
                                + "; ".join(ROCM.missing) + " (make rocm installs it)")
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")


def _res(regs, threads, shared=0):
    return GpuResources(schedule="gemm", kernels=1, threads_per_block=threads,
                        registers_per_thread=regs, shared_bytes=shared)


def test_cuda_occupancy_counts_whole_warps_of_256_registers_and_reserved_shared():
    a100 = tf.load_target("a100")
    # 72 registers x 32 lanes = 2304 (9 units of 256): 65536 / 2304 = 28 warps, 4 per block
    assert blocks_per_unit(a100, _res(72, 128, 6912)) == 7
    # 33 registers round up to 1280 per warp: 51 warps, 8 per block -> 6 (threads allow 8)
    assert blocks_per_unit(a100, _res(33, 256)) == 6
    # shared: (40960 + 1 KB reserved) rounded to 128 B -> 167936 // 41984 = 4
    assert blocks_per_unit(a100, _res(24, 256, 40960)) == 4


def test_cdna2_occupancy_counts_vgpr_granules_per_simd_and_lds():
    mi = tf.load_target("mi250x")
    # 151 VGPRs -> 152: 512 // 152 = 3 waves per SIMD, 12 per CU, 2 waves per block -> 6
    assert waves_per_simd(_res(151, 128)) == 3 and blocks_per_unit(mi, _res(151, 128)) == 6
    assert waves_per_simd(_res(110, 256)) == 4 and waves_per_simd(_res(64, 256)) == 8
    # 64 VGPRs, 4 waves per block: 8 per SIMD -> 8 blocks; LDS 6912 B would allow 9
    assert blocks_per_unit(mi, _res(64, 256, 6912)) == 8
    # one-wave blocks: 32 per CU (8 waves x 4 SIMDs), no barrier limit
    assert blocks_per_unit(mi, _res(14, 64)) == 32
    # LDS: 65536 // 20000 = 3 blocks
    assert blocks_per_unit(mi, _res(32, 256, 20000)) == 3
    # AGPRs share the file; the code object's .vgpr_count is already the total (PP-OCR
    # rec's matmul2: next_free_vgpr 448 = accum_offset 256 + 192 AGPRs): 1 wave per SIMD
    r = AmdgpuResources(entry="k", vgprs=448, agprs=192, sgprs=26, lds_bytes=6912,
                        scratch_bytes=0, vgpr_spills=0, sgpr_spills=0,
                        max_workgroup_size=256, wavefront_size=64)
    assert r.unified_vgprs == 448 and not r.spills
    assert waves_per_simd(_res(r.unified_vgprs, 256)) == 1
    assert blocks_per_unit(mi, _res(r.unified_vgprs, 256, 6912)) == 1


def test_amdgpu_metadata_reads_each_kernel_and_skips_its_args():
    asm = """
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     4
    .args:
      - .address_space:  global
        .name:           p_0
        .offset:         0
    .group_segment_fixed_size: 6912
    .max_flat_workgroup_size: 256
    .name:           fused_kernel
    .private_segment_fixed_size: 16
    .sgpr_count:     21
    .sgpr_spill_count: 0
    .vgpr_count:     151
    .vgpr_spill_count: 3
    .wavefront_size: 64
  - .agpr_count:     0
    .args:
      - .name:           p_1
    .group_segment_fixed_size: 0
    .name:           fused_kernel_1
    .vgpr_count:     8
amdhsa.target:   amdgcn-amd-amdhsa--gfx90a
\t.end_amdgpu_metadata
"""
    first, second = parse_amdgpu_metadata(asm)
    assert (first.entry, first.vgprs, first.agprs, first.sgprs) == ("fused_kernel", 151, 4, 21)
    assert (first.lds_bytes, first.scratch_bytes, first.vgpr_spills) == (6912, 16, 3)
    assert first.spills and first.unified_vgprs == 151
    assert (second.entry, second.vgprs, second.lds_bytes) == ("fused_kernel_1", 8, 0)
    assert parse_amdgpu_metadata("no metadata") == ()


def _gemm_gelu():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Erf", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "gemm_erf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 256])],
        initializer=[numpy_helper.from_array(rng.standard_normal((256, 256)).astype("float32"), "w"),
                     numpy_helper.from_array(rng.standard_normal(256).astype("float32"), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_rocm
def test_a_fused_gemm_epilogue_builds_a_gfx90a_code_object_and_reads_its_registers():
    model = tf.import_model(_gemm_gelu(), name="gemm-erf")
    hw = tf.load_target("mi250x")
    graph = tf.build_graph(model.mod)
    plan = tf.plan_fusion(graph, hw)
    assert len(plan.groups) == 1  # matmul + bias + erf in one kernel
    rules = {}
    mod = default_gpu_schedule(tf.apply_plan(graph, plan), hw.tvm_target(), hw, rules_used=rules)
    name = plan.groups[0].name
    res = compile_group(mod[name], hw, name, rules[name])
    assert rules[name] == "Matmul" and res.schedule == "gemm" and res.kernels == 1
    assert res.source == "gfx90a code object"
    # dlight's 16 x 8 threads, A and B tiles staged in LDS, real VGPRs allocated
    assert res.threads_per_block == 128 and res.shared_bytes == 6912
    assert 32 <= res.registers_per_thread <= 512 and res.spill_bytes == 0


@needs_rocm
def test_the_mi250x_plan_uses_the_code_objects_registers_and_says_so():
    graph = tf.build_graph(tf.import_model(build_embedded_model(), name="embedded").mod)
    plan, report = plan_with_compiled_resources(graph, "mi250x")
    rows = {r.name: r for r in report.rows}
    assert set(rows) == {g.name for g in plan.groups}
    mi = tf.load_target("mi250x")
    for g in plan.groups:
        row = rows[g.name]
        assert f"compiled (gfx90a code object): {row.registers} VGPRs per lane" in g.reason
        assert row.blocks_per_unit == blocks_per_unit(mi, GpuResources(
            schedule=row.schedule, kernels=row.kernels, threads_per_block=row.threads_per_block,
            registers_per_thread=row.registers, shared_bytes=row.shared_bytes))
    conv = next(r for r in report.rows if r.name.startswith("fused_conv2d"))
    # the conv's tiled GEMM holds far more VGPRs than the estimate calibrated on nvcc
    assert conv.registers > conv.predicted_registers
    assert conv.waves_per_simd == waves_per_simd(_res(conv.registers, 128)) < 8
    assert "6 of 6 kernels compiled (gfx90a code object" in plan.notes[-1]
    # the plan JSON carries each group's compiled numbers, and reads them back
    back = tf.FusionPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back.hash == plan.hash
    for g, h in zip(plan.groups, back.groups):
        assert h.resources == g.resources and g.resources["source"] == "gfx90a code object"
        assert g.resources["registers"] == rows[g.name].registers
    # the notebook's plan view shows them
    from tvm_fusion.explore import plan_html

    view = plan_html(plan)
    assert "kernel resources from the gfx90a code object" in view and "waves per SIMD" in view


def _qkv():
    """A Q/K/V projection: one matmul, a split in three, each reshaped and transposed."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Split", ["a", "s"], ["q", "k", "v"], axis=1)]
    outs = []
    for n in "qkv":
        nodes.append(helper.make_node("Reshape", [n, "shape"], [n + "r"]))
        nodes.append(helper.make_node("Transpose", [n + "r"], [n + "t"], perm=[1, 0, 2]))
        outs.append(helper.make_tensor_value_info(n + "t", TensorProto.FLOAT, [4, 128, 32]))
    graph = helper.make_graph(
        nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 128])], outs,
        initializer=[
            numpy_helper.from_array(rng.standard_normal((128, 384)).astype("float32"), "w"),
            numpy_helper.from_array(rng.standard_normal(384).astype("float32"), "b"),
            numpy_helper.from_array(np.array([128, 128, 128], dtype="int64"), "s"),
            numpy_helper.from_array(np.array([128, 4, 32], dtype="int64"), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_nvcc
def test_a_split_after_a_gemm_is_priced_as_the_kernels_ptxas_builds():
    """dlight makes each result of a Split a kernel of its own (MiniLM's Q/K/V matmul +
    bias + split compiled into 4 kernels on sm_80 and on gfx90a), so the estimate keeps
    the matmul apart from the split and counts the split's 3 kernels; compiling every
    group agrees with it, and the matmul is dlight's tiled Matmul."""
    graph = tf.build_graph(tf.import_model(_qkv(), name="qkv").mod)
    first = tf.plan_fusion(graph, "a100")
    assert len(first.groups) == 2
    assert not any("matmul" in g.name and "split" in g.name for g in first.groups)
    plan, report = plan_with_compiled_resources(graph, "a100", start=first)
    assert report.rounds == 1 and report.changed == ()
    split = next(r for r in report.rows if "split" in r.name)
    assert split.kernels == 3
    gemm = next(r for r in report.rows if "matmul" in r.name)
    assert gemm.schedule == "gemm" and gemm.kernels == 1 and gemm.shared_bytes > 0
    assert all("compiled (ptxas sm_80)" in g.reason for g in plan.groups)
    assert "one group (3 kernels compiled)" in next(g.reason for g in plan.groups
                                                     if "split" in g.name)


def _masked_scores():
    """Attention scores with a mask prologue: matmul / scale + (1 - mask) * -1e4."""
    F = TensorProto.FLOAT
    nodes = [helper.make_node("Unsqueeze", ["mask", "ax"], ["m1"]),
             helper.make_node("Cast", ["m1"], ["mf"], to=F),
             helper.make_node("Sub", ["one", "mf"], ["inv"]),
             helper.make_node("Mul", ["inv", "big"], ["bias"]),
             helper.make_node("MatMul", ["q", "k"], ["s"]),
             helper.make_node("Div", ["s", "scale"], ["sd"]),
             helper.make_node("Add", ["sd", "bias"], ["o"])]
    graph = helper.make_graph(
        nodes, "masked", [helper.make_tensor_value_info("q", F, [4, 128, 32]),
                          helper.make_tensor_value_info("k", F, [4, 32, 128]),
                          helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 128])],
        [helper.make_tensor_value_info("o", F, [4, 128, 128])],
        initializer=[numpy_helper.from_array(np.array([0], dtype="int64"), "ax"),
                     numpy_helper.from_array(np.array(1.0, dtype="float32"), "one"),
                     numpy_helper.from_array(np.array(-1e4, dtype="float32"), "big"),
                     numpy_helper.from_array(np.array(5.657, dtype="float32"), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_group_the_compiler_built_as_several_kernels_is_not_fused_again():
    """MiniLM's mask prologue + score matmul compiled into 3 kernels where the estimate
    counted one; given that (as plan_with_compiled_resources passes it), the planner
    refuses the merge and says what the compiler built."""
    graph = tf.build_graph(tf.import_model(_masked_scores(), name="masked").mod)
    hw = tf.load_target("a100")
    first = tf.plan_fusion(graph, hw)
    assert len(first.groups) == 1
    whole = frozenset(first.groups[0].nodes)
    built = GpuResources(schedule="split", kernels=3, threads_per_block=128,
                         registers_per_thread=64, shared_bytes=6912, source="ptxas sm_80")
    plan = make_plan(graph, hw, compiled={whole: built})
    assert len(plan.groups) > 1
    assert any("compiled (ptxas sm_80) the group is 3 kernels" in r.reason
               for r in plan.rejected), [r.reason for r in plan.rejected]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tvm_fusion", *map(str, args)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@needs_rocm
def test_plan_cli_prints_predicted_against_compiled_resources():
    proc = _cli("plan", "embedded", "--target", "mi250x", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "kernel resources from the gfx90a code object" in proc.stdout
    assert "waves/SIMD" in proc.stdout and "VGPRs" in proc.stdout
    est = _cli("plan", "embedded", "--target", "mi250x", "--resources", "estimated", "--quiet")
    assert est.returncode == 0 and "kernel resources from" not in est.stdout


def test_plan_cli_compiled_resources_without_the_compiler_says_what_to_install(tmp_path):
    proc = _cli("plan", "embedded", "--target", "a100", "--resources", "compiled",
                env={"TVM_FUSION_NVCC": str(tmp_path / "no-nvcc")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs nvcc" in proc.stderr and "Traceback" not in proc.stderr
    auto = _cli("plan", "embedded", "--target", "a100", "--quiet",
                env={"TVM_FUSION_NVCC": str(tmp_path / "no-nvcc")})
    assert auto.returncode == 0, auto.stderr
    assert "kernel resources: estimated, not compiled" in auto.stdout


def test_a_gfx90a_kernel_the_backend_cannot_fit_is_named_with_its_numbers():
    from tvm_fusion.gpu.amdgpu import amdgpu_violations

    mi = tf.load_target("mi250x")
    ok = AmdgpuResources(entry="k", vgprs=448, agprs=192, sgprs=26, lds_bytes=6912,
                         scratch_bytes=0, vgpr_spills=0, sgpr_spills=0,
                         max_workgroup_size=256, wavefront_size=64)
    assert amdgpu_violations(ok, mi) == []
    bad = AmdgpuResources(entry="k", vgprs=520, agprs=0, sgprs=26, lds_bytes=70000,
                          scratch_bytes=256, vgpr_spills=12, sgpr_spills=0,
                          max_workgroup_size=256, wavefront_size=64)
    found = amdgpu_violations(bad, mi)
    assert len(found) == 3
    assert "520 VGPRs per lane" in found[0] and "limit 512" in found[0]
    assert "70000 B of LDS" in found[1] and "limit 65536" in found[1]
    assert "256 B per lane" in found[2] and "12 VGPRs" in found[2]


@needs_rocm
def test_check_schedule_reads_the_gfx90a_code_object():
    from tvm_fusion.gpu import check_schedule

    model = tf.import_model(_gemm_gelu(), name="gemm-erf")
    hw = tf.load_target("mi250x")
    graph = tf.build_graph(model.mod)
    plan = tf.plan_fusion(graph, hw)
    mod = default_gpu_schedule(tf.apply_plan(graph, plan), hw.tvm_target(), hw)
    assert check_schedule(mod[plan.groups[0].name], hw) == []


@needs_rocm
def test_each_fusion_is_checked_with_both_sides_compiled():
    """benchmarks.gpu_resources --decisions: every fused conv/GEMM group of the MI250X plan
    is priced against its parts, each side with what the gfx90a backend allocated."""
    from benchmarks.gpu_resources import split_decisions

    graph = tf.build_graph(tf.import_model(build_embedded_model(), name="embedded").mod)
    plan, report = plan_with_compiled_resources(graph, "mi250x")
    rows = split_decisions(graph, plan, tf.load_target("mi250x"), report.compiled)
    heavy = [g for g in plan.groups if len(g.nodes) > 1 and any(
        graph.nodes[n].kind in ("gemm", "conv", "depthwise", "reduction") for n in g.nodes)]
    assert {r["group"] for r in rows} == {g.name for g in heavy} and rows
    compiled = {g.name: report.compiled[frozenset(g.nodes)] for g in heavy}
    for r in rows:
        assert r["fused_registers"] == compiled[r["group"]].registers_per_thread
        assert r["anchor_registers"] > 0  # the anchor alone was compiled too
        # each fusion saves most of a launch (8 us on MI250X), beyond the tie margin
        assert r["saving_us"] > r["margin_us"]
