"""MI250X modules built here: gfx90a code objects, fp16 GEMMs on matrix cores (MFMA),
what each kernel allocated in the module's description, and a clear refusal to run one
on a machine without a ROCm runtime."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.errors import ModuleLoadError
from tvm_fusion.gpu.amdgpu import find_toolchain, mfma_counts
from tvm_fusion.gpu.precision import apply_precision

ROOT = Path(__file__).resolve().parents[1]
ROCM = find_toolchain()
pytestmark = pytest.mark.skipif(bool(ROCM.missing), reason="no gfx90a toolchain here: "
                                + "; ".join(ROCM.missing) + " (make rocm installs it)")
EM_AMDGPU = 0xE0


def _matmul_bias_gelu(m: int, k: int, n: int):
    """A transformer FFN's first half: x @ W + b, then erf-GELU."""
    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype("float32"), "w"),
              numpy_helper.from_array(rng.standard_normal(n).astype("float32"), "b"),
              numpy_helper.from_array(np.array(0.5, "float32"), "half"),
              numpy_helper.from_array(np.array(np.sqrt(2.0), "float32"), "sqrt2"),
              numpy_helper.from_array(np.array(1.0, "float32"), "one")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["yb"]),
             helper.make_node("Mul", ["yb", "half"], ["h"]),
             helper.make_node("Div", ["yb", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["h", "e1"], ["z"])]
    graph = helper.make_graph(
        nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, m, n])], initializer=consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _gemm_kernel(compiled):
    (name,) = [k for k in compiled.info["code_objects"] if "matmul" in k]
    return name, compiled.info["code_objects"][name]


def _asm(compiled) -> str:
    mods, stack = [], [compiled.executable.mod]
    while stack:
        mods.append(stack.pop())
        stack.extend(mods[-1].imports)
    return next(m for m in mods if m.kind == "hip").inspect_source("asm")


def test_a_fused_fp16_matmul_bias_gelu_runs_on_mfma_in_one_kernel():
    model = apply_precision(tf.import_model(_matmul_bias_gelu(128, 256, 512), name="ffn"),
                            "fp16")
    compiled = tf.compile_model(model, "mi250x")
    name, res = _gemm_kernel(compiled)
    assert "erf" in name  # bias and GELU are in the GEMM's kernel, not kernels of their own
    assert res["mfma"] > 0 and "v_mfma_f32_16x16x16f16" in _asm(compiled)
    assert mfma_counts(_asm(compiled))[name] == res["mfma"]
    # a 64 x 64 x 32 block tile: A and B staged in LDS (8 KiB), fp32 accumulators back
    # through LDS (16 KiB) for the epilogue; four waves of 64 lanes
    assert res["lds_bytes"] == 24576 and res["scratch_bytes"] == 0
    assert 0 < res["vgprs"] <= 128 and res["waves_per_simd"] >= 4


def test_fp32_and_small_gemms_stay_on_fma():
    fp32 = tf.compile_model(tf.import_model(_matmul_bias_gelu(128, 256, 512), name="ffn"),
                            "mi250x")
    assert _gemm_kernel(fp32)[1]["mfma"] == 0  # MFMA here is fp16 x fp16 -> fp32 only
    # a side of 64 or less: dlight's threshold for tensor cores on CUDA, kept on CDNA
    small = apply_precision(tf.import_model(_matmul_bias_gelu(50, 64, 70), name="ffn-s"),
                            "fp16")
    assert _gemm_kernel(tf.compile_model(small, "mi250x"))[1]["mfma"] == 0


def _elf_machines(blob: bytes) -> list[int]:
    out, at = [], blob.find(b"\x7fELF")
    while at >= 0:
        out.append(struct.unpack("<H", blob[at + 18:at + 20])[0])
        at = blob.find(b"\x7fELF", at + 1)
    return out


def test_compile_cli_writes_gfx90a_code_objects_that_this_machine_refuses_to_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "m.so"
    proc = subprocess.run([sys.executable, "-m", "tvm_fusion", "compile", "embedded",
                           "--target", "mi250x", "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gfx90a code objects:" in proc.stdout
    info = json.loads(out.with_name("m.so.json").read_text())
    objects = info["code_objects"]
    # one kernel entry (at least) per fused kernel of the plan, each with its numbers
    assert len(objects) >= len(info["kernels"]) - 1  # a host-only kernel has none
    assert all(o["vgprs"] > 0 and o["scratch_bytes"] == 0 for o in objects.values())
    # the host library embeds the linked code object: an AMDGPU ELF besides the x86 one
    assert EM_AMDGPU in _elf_machines(out.read_bytes())
    with pytest.raises(ModuleLoadError, match="USE_ROCM=ON"):
        tf.load_module(out)
    run = subprocess.run([sys.executable, "-m", "tvm_fusion", "run", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 2 and "AMD GPU" in run.stderr and "Traceback" not in run.stderr


def test_the_mi250x_plan_expects_an_fp16_gemm_on_mfma_and_the_code_object_confirms_it():
    from tvm_fusion.gpu.resources import plan_with_compiled_resources
    from tvm_fusion.plan import plan_model
    from tvm_fusion.plan.gpu_resources import MFMA_SHARED

    model = apply_precision(tf.import_model(_matmul_bias_gelu(128, 256, 512), name="ffn"),
                            "fp16")
    graph, first = plan_model(model.mod, "mi250x")
    plan, report = plan_with_compiled_resources(graph, "mi250x", start=first)
    (gemm,) = [g for g in plan.groups if any("matmul" in op for op in g.ops)]
    assert gemm.resources["schedule"] == "gemm-mfma"  # what the code object holds
    assert gemm.resources["shared_bytes"] == MFMA_SHARED  # estimated exactly
    assert gemm.resources["threads_per_block"] == 256
    assert "compiled (gfx90a code object)" in gemm.reason
    # on the A100 the same GEMM is dlight's WMMA (ptxas); both plans keep its epilogue
    a100 = plan_model(model.mod, "a100")[1]
    assert [sorted(g.ops) for g in a100.groups] == [sorted(g.ops) for g in plan.groups]


def test_fp16_pointwise_convs_with_relu6_and_hardswish_run_on_mfma():
    """A CNN's 1x1 convs are GEMMs: in fp16 each, with its ReLU6 or HardSwish, is one
    gfx90a kernel on the matrix cores (the clips ToMixedPrecision could not convert
    before are Relax ops now)."""
    import onnx_cases as oc

    proto = oc.relu6_pointwise(channels=128, out_channels=128, size=16)
    compiled = tf.compile_model(apply_precision(tf.import_model(proto, name="r6"), "fp16"),
                                "mi250x")
    convs = {k: v for k, v in compiled.info["code_objects"].items() if "conv2d" in k}
    assert len(convs) == 2 and all("minimum" in k for k in convs)  # epilogues fused
    assert all(v["mfma"] > 0 and v["scratch_bytes"] == 0 for v in convs.values()), convs
    assert "v_mfma_f32_16x16x16f16" in _asm(compiled)
