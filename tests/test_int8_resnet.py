"""The int8 convs of a QDQ ResNet are planned blocked, on VNNI (issue 39 part 4).

A ResNet-50 quantized with ONNX Runtime's ``quantize_static`` has no depthwise conv: every
conv, the RGB stem's included, takes the ``conv2d_NCHWc_int8`` form in NCHW16c
(graph/int8_conv.py), a ``call_tir`` and no ``relax.nn.conv2d`` any more. Counted as no
conv, the planner kept it in NCHW ("no conv2d with channels divisible by 16"), where each
int8 conv is integer loops: 2.2 s an inference against 0.34 s for its fp32 build. Here a
ResNet's head and first two bottlenecks, quantized as ``quantize_static`` writes it (an
NHWC input transposed, the input's zero point padding the 7x7 stem, per-channel int8
weights, int32 biases, ReLUs folded into zero-point-0 quantizes, zero points of 117 and
126 on the paths into the residual adds), power-of-two scales so that ONNX Runtime's
output is exact: the planner's own layout choice blocks all eight convs, each residual
add runs at its conv's VNNI tile, and the output equals ONNX Runtime's bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cases import _vi, const, make
from tvm_fusion import compile_model, import_model, load_target
from tvm_fusion.graph.layout import convert_layout, count_blocked_convs
from tvm_fusion.reference import random_inputs, run_onnxruntime


def _vnni() -> bool:
    return bool({"avx512_vnni", "avx_vnni"} & set(load_target("host").features))


def qdq_resnet_head(size=32, seed=0):
    """x (NHWC) -> Transpose -> Q/DQ (zero point 126) -> Conv 7x7/2 3->64 (bias) -> Q/DQ
    -> MaxPool 3x3/2 -> Q/DQ -> {Conv 1x1 64->256 -> Q/DQ (zp 117);
    Conv 1x1 64->64 -> Q/DQ -> Conv 3x3 64->64 -> Q/DQ -> Conv 1x1 64->256 -> Q/DQ
    (zp 126)} -> Add -> Q/DQ (zp 0: the ReLU) -> sum; then an identity bottleneck
    (Conv 1x1 256->64, 3x3, 1x1 64->256) whose Add reads the sum's DQ -> Q/DQ -> y."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    scales = {"x": 2.0 ** -5}  # tensor -> its activation scale

    def qdq(src, dst, scale_exp, zp):
        scales[dst] = 2.0 ** scale_exp
        inits.extend([const(f"{dst}_s", 2.0 ** scale_exp), const(f"{dst}_z", zp, np.uint8)])
        nodes.extend([h.make_node("QuantizeLinear", [src, f"{dst}_s", f"{dst}_z"], [f"{dst}_q"]),
                      h.make_node("DequantizeLinear", [f"{dst}_q", f"{dst}_s", f"{dst}_z"], [dst])])

    def conv(src, dst, cin, cout, k, stride=1):
        w = rng.integers(-127, 128, (cout, cin, k, k)).astype(np.int8)
        ws = 2.0 ** -rng.integers(7, 10, cout)
        bs = scales[src] * ws  # the int32 bias' scale, as quantize_static writes it
        inits.extend([nh.from_array(w, f"{dst}_w"), const(f"{dst}_ws", ws),
                      const(f"{dst}_wz", np.zeros(cout), np.int8),
                      const(f"{dst}_b", rng.integers(-2000, 2000, cout), np.int32),
                      const(f"{dst}_bs", bs), const(f"{dst}_bz", np.zeros(cout), np.int32)])
        nodes.extend([
            h.make_node("DequantizeLinear", [f"{dst}_w", f"{dst}_ws", f"{dst}_wz"],
                        [f"{dst}_wd"], axis=0),
            h.make_node("DequantizeLinear", [f"{dst}_b", f"{dst}_bs", f"{dst}_bz"],
                        [f"{dst}_bd"], axis=0),
            h.make_node("Conv", [src, f"{dst}_wd", f"{dst}_bd"], [f"{dst}_f"], name=dst,
                        kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)])

    nodes.append(h.make_node("Transpose", ["x_nhwc"], ["x_f"], perm=[0, 3, 1, 2]))
    qdq("x_f", "x", -5, 126)
    conv("x", "stem", 3, 64, 7, stride=2)
    qdq("stem_f", "stem_o", -3, 0)
    nodes.append(h.make_node("MaxPool", ["stem_o"], ["pool_f"], kernel_shape=[3, 3],
                             strides=[2, 2], pads=[1, 1, 1, 1]))
    qdq("pool_f", "pool", -3, 0)
    conv("pool", "short", 64, 256, 1)
    qdq("short_f", "short_o", -2, 117)
    conv("pool", "a", 64, 64, 1)
    qdq("a_f", "a_o", -3, 0)
    conv("a_o", "b", 64, 64, 3)
    qdq("b_f", "b_o", -1, 0)
    conv("b_o", "c", 64, 256, 1)
    qdq("c_f", "c_o", 0, 126)
    nodes.append(h.make_node("Add", ["c_o", "short_o"], ["sum_f"]))
    qdq("sum_f", "sum", 0, 0)
    # an identity bottleneck: its shortcut reads the sum in float (DQ(Q(sum))) and its
    # first conv the sum's uint8, so the kernel of the last conv above has two outputs
    conv("sum", "d", 256, 64, 1)
    qdq("d_f", "d_o", 1, 0)
    conv("d_o", "e", 64, 64, 3)
    qdq("e_f", "e_o", 3, 0)
    conv("e_o", "f", 64, 256, 1)
    qdq("f_f", "f_o", 4, 126)
    nodes.append(h.make_node("Add", ["f_o", "sum"], ["out_f"]))
    qdq("out_f", "y", 4, 0)
    out = size // 4
    return make("qdq_resnet_head", nodes, [_vi("x_nhwc", T.FLOAT, [1, size, size, 3])],
                [_vi("y", T.FLOAT, [1, 256, out, out])], inits)


@pytest.fixture(scope="module")
def resnet_head():
    proto = qdq_resnet_head()
    model = import_model(proto)
    return proto, model, compile_model(model, "host")  # the planner's own layout choice


def test_qdq_resnet_convs_are_counted_blocked(resnet_head):
    """All eight convs (the 3-channel stem too) are blocked, as ``call_tir`` of
    ``conv2d_NCHWc_int8``, and counted so."""
    _, model, _ = resnet_head
    assert model.simplified.int8_gemms == 8
    assert count_blocked_convs(model.mod) == (0, 8)
    if not _vnni():  # an AVX2 CPU blocks by its 8 lanes: no VNNI form, convs stay conv2d
        pytest.skip("this CPU has no VNNI: no conv2d_NCHWc_int8 form to count")
    assert count_blocked_convs(convert_layout(model.mod, "NCHW16c")) == (8, 8)


def test_qdq_resnet_plans_blocked_on_vnni_and_matches_onnxruntime(resnet_head):
    proto, model, compiled = resnet_head
    plan = compiled.plan
    if _vnni():
        assert plan.layout == "NCHW16c", plan.layout_reason
        assert "8 of 8 convs blocked" in plan.layout_reason
        convs = [g for g in plan.groups if any(o.startswith("conv2d_NCHWc_int8") for o in g.ops)]
        assert len(convs) == 8, [g.ops for g in plan.groups]
        assert all("int8 GEMM priced on VNNI" in g.reason for g in convs)
        assert not any(o.startswith("conv2d") and not o.startswith("conv2d_NCHWc_int8")
                       for g in plan.groups for o in g.ops)
        # the NHWC input's transpose and the NCHW output's: none between the convs
        moves = [o for g in plan.groups for o in g.ops if o.startswith("layout_transform")]
        assert len(moves) <= 2, plan.groups
    if "avx512_vnni" in load_target("host").features:
        kinds = {k: v for k, v in compiled.info["schedule_notes"].items()
                 if "conv2d_NCHWc_int8" in k}
        assert len(kinds) == 8 and set(kinds.values()) == {"VNNI int8 schedule"}, kinds
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    inputs = [2 * x for x in random_inputs(model.inputs, seed=3)]
    got = vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    # ONNX Runtime as deployed where its int8 kernels are exact (VNNI), else op by op
    want = run_onnxruntime(proto, inputs, optimize=_vnni())[0]
    assert np.unique(want).size > 40 and (want > 0).mean() > 0.2  # not a saturated output
    np.testing.assert_array_equal(got, want)


def test_prepacking_leaves_the_vnni_conv_weights_as_packed(resnet_head):
    """Tuning marks a kernel's constants layout-free for MetaSchedule's RewriteLayout,
    but not the int8 weight of a ``conv2d_NCHWc_int8`` block: it is in VNNI's layout
    already, and with it marked tuning this model crashed after its first batch
    (kernels/prepack.py). The epilogue's constants stay marked."""
    from tvm import s_tir
    from tvm_fusion.plan import graph_for_plan
    from tvm_fusion.kernels.prepack import ATTR
    from tvm_fusion.kernels.schedulable import kernel_module

    _, model, compiled = resnet_head
    if compiled.plan.layout != "NCHW16c":
        pytest.skip("no VNNI form on this CPU (its convs are not conv2d_NCHWc_int8)")
    mod = kernel_module(graph_for_plan(model.mod, compiled.plan), compiled.plan, prepack=True)
    convs = 0
    for func in mod.functions.values():
        if not isinstance(func, tvm.tirx.PrimFunc) or '"conv2d_NCHWc_int8"' not in func.script():
            continue
        convs += 1
        sch = s_tir.Schedule(func)
        conv = sch.get(sch.get_sblock("conv2d_NCHWc_int8"))
        weight = [i for i, p in enumerate(func.params)
                  if str(p.dtype) == "int8" and any(r.source.same_as(p) for r in conv.reads)]
        marked = [int(i) for i in (func.attrs.get(ATTR, []) if func.attrs else [])]
        assert len(weight) == 1 and weight[0] not in marked, (weight, marked)
        assert marked, "the epilogue's per-channel constants stay layout-free"
    assert convs == 8


def test_residual_epilogues_run_at_the_vnni_tile(resnet_head):
    """The kernel of a bottleneck's last conv adds the shortcut and has two outputs (the
    float sum the next shortcut reads, its uint8 the next conv reads); the next one also
    requantizes its shortcut first (a block before the conv that only the epilogue
    reads). Untuned, every such epilogue runs at the conv's VNNI tile
    (schedules/vnni._epilogues_at, _feeds_only_epilogue): left as loop nests over the int32
    accumulators written out in full, they made QDQ ResNet-50's 16 residual kernels its
    slowest (2.4 ms against 0.24 ms for the first). No conv kernel has a loop nest over
    its accumulators outside the tile but the stem's (its output changes layout): only
    a padding of a conv's input runs outside it."""
    from tvm import s_tir
    from tvm_fusion.schedules.default import default_cpu_schedule
    from tvm_fusion.plan import graph_for_plan
    from tvm_fusion.kernels.schedulable import kernel_module

    _, model, compiled = resnet_head
    if "avx512_vnni" not in load_target("host").features:
        pytest.skip("the VNNI default schedule needs avx512_vnni")
    mod = default_cpu_schedule(kernel_module(graph_for_plan(model.mod, compiled.plan),
                                             compiled.plan, prepack=False),
                               tvm.target.Target(compiled.info["tvm_target"]))
    kernels = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc) or '"conv2d_NCHWc_int8_init"' not in func.script():
            continue
        sch = s_tir.Schedule(func)
        tile = sch.get_loops(sch.get_sblock("conv2d_NCHWc_int8_init"))[0]
        at_tile = [sch.get(b).name_hint for b in sch.get_child_blocks(tile)]
        at_root = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
        if "subtract" in gv.name_hint:  # the stem: its zero point, its NCHW output
            continue
        # the epilogue at the tile: outside it only a padding of the conv's input
        outside = set(at_root) - set(at_tile)
        assert all("pad" in n for n in outside), (gv.name_hint, outside)
        kernels[gv.name_hint] = at_tile
    assert len(kernels) == 7, kernels
    # the first bottleneck's last conv: the sum and its quantization, both at the tile
    two = [k for k, t in kernels.items() if "quantized" in t and any(n.startswith("T_add") for n in t)]
    assert len(two) == 1, kernels
    # the second's: its shortcut's requantization inlined into the epilogue at the tile
    assert sum(k.startswith("fused_fake_quantize") for k in kernels) == 1, kernels
