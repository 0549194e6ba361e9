"""The pipeline stages on the embedded model: graph, plan, apply, build, verify."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_fusion as tf
from tvm_fusion.embedded import build_embedded_model
from tvm_fusion.errors import ModuleLoadError, PlanError
from tvm_fusion.plan import FusionPlan, apply_plan, plan_from_groups
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
from tvm_fusion.tune.verify import KernelVerifier, faster_than_default


@pytest.fixture(scope="module")
def model():
    # as converted: the node ids and kernel names below are that graph's (simplification
    # folds its batch norms into the convs)
    return tf.import_model(build_embedded_model(), name="embedded", simplify=False)


@pytest.fixture(scope="module")
def graph(model):
    return tf.build_graph(model.mod)


def _kernels_called(mod: tvm.IRModule) -> list[str]:
    names = []

    def visit(e):
        if isinstance(e, tvm.relax.Call) and getattr(e.op, "name", "") == "relax.call_tir":
            names.append(e.args[0].name_hint)

    tvm.relax.analysis.post_order_visit(mod["main"].body, visit)
    return names


def test_graph_nodes_carry_kinds_shapes_and_costs(graph):
    kinds = [n.kind for n in graph.nodes]
    assert kinds.count("gemm") >= 4  # 2 convs, 2 matmuls (mean/softmax also anchor)
    conv = graph.nodes[0]
    assert conv.op.startswith("conv2d") and conv.shape == (1, 16, 32, 32)
    # 3x3 conv, 3 -> 16 channels on 32x32: 2 * 16*32*32 * 3*3*3 FLOPs
    assert conv.flops == pytest.approx(2 * 16 * 32 * 32 * 27, rel=0.05)
    assert conv.bytes_written == 16 * 32 * 32 * 4
    assert graph.outputs == (len(graph.nodes) - 1,)


def test_fuseops_plan_groups_epilogues(graph):
    plan = tf.plan_fusion(graph, "host", planner="fuseops")
    by_anchor = {graph.nodes[g.nodes[0]].op: g for g in plan.groups}
    stem = by_anchor["conv2d"]
    # Conv, the four decomposed BatchNorm ops and the ReLU share one kernel.
    assert [graph.nodes[n].op for n in stem.nodes][-1] == "relu"
    assert len(stem.nodes) == 6
    # The residual Add and its ReLU join the second conv's epilogue.
    block = by_anchor["conv2d1"]
    assert any(graph.nodes[n].op.startswith("add") and len(graph.nodes[n].inputs) == 2
               for n in block.nodes)
    assert sorted(n for g in plan.groups for n in g.nodes) == [n.id for n in graph.nodes]
    assert len(plan.groups) == 7
    # The SiLU diamond (x * sigmoid(x)) joins its matmul: FuseOps follows post-dominators.
    silu = by_anchor["matmul"]
    assert [graph.nodes[n].op for n in silu.nodes][-1].startswith("multiply")
    assert all(g.est_us > 0 and g.reason for g in plan.groups)


def test_plan_json_round_trip_and_tamper_check(graph, tmp_path):
    plan = tf.plan_fusion(graph, "host")
    path = tmp_path / "plan.json"
    plan.save(path)
    again = FusionPlan.load(path)
    assert again == plan and again.hash == plan.hash
    doc = plan.to_json()
    doc["groups"][0]["nodes"] = doc["groups"][0]["nodes"][:-1]
    with pytest.raises(PlanError, match="hash mismatch"):
        FusionPlan.from_json(doc)
    with pytest.raises(PlanError, match="version"):
        FusionPlan.from_json({**plan.to_json(), "version": 99})


def test_a_different_grouping_applies_and_stays_correct(model, graph):
    """Not FuseOps' grouping: BN+ReLU apart from its conv, and mean+reshape together
    (with the SiLU diamond in its matmul's kernel, as FuseOps has it)."""
    hw = tf.load_target("host")
    base = tf.plan_fusion(graph, hw, planner="fuseops")
    ops = [n.op for n in graph.nodes]
    groups = []
    for g in base.groups:
        names = [ops[n] for n in g.nodes]
        if names[0] == "conv2d":
            groups += [[g.nodes[0]], list(g.nodes[1:])]
        elif names[0] in ("matmul", "tir_sigmoid", "mean", "reshape"):
            continue
        else:
            groups.append(list(g.nodes))
    mm = ops.index("matmul")
    groups.append([mm, mm + 1, mm + 2, mm + 3])  # matmul, add, sigmoid, multiply
    mean = ops.index("mean")
    groups.append([mean, mean + 1])
    plan = plan_from_groups(graph, groups, hw, planner="hand-made")
    assert len(plan.groups) == len(base.groups) + 1 - 1  # conv split; mean+reshape one
    fused = apply_plan(graph, plan)
    called = _kernels_called(fused)
    assert len(called) == len(plan.groups)
    assert "fused_matmul_add3_tir_sigmoid_multiply1" in called
    assert "conv2d" in called  # the stem conv now stands alone

    compiled = tf.compile_model(model, hw, plan=plan)
    assert set(compiled.kernels) >= set(called)
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    inputs = random_inputs(model.inputs, seed=3)
    got = vm["main"](tvm.runtime.tensor(inputs[0])).numpy()
    want = run_onnxruntime(model.onnx_model, inputs)[0]
    assert max_rel_error(got, want) <= 1e-4


def test_multi_output_group(model, graph):
    """A group whose intermediate is also read outside it becomes a multi-output kernel."""
    hw = tf.load_target("host")
    ops = [n.op for n in graph.nodes]
    stem_relu = ops.index("relu")
    # The stem's ReLU output feeds both the next conv and the residual add; put the
    # stem and the next conv together so the ReLU output must leave the kernel too.
    base = tf.plan_fusion(graph, hw, planner="fuseops")
    groups = [list(g.nodes) for g in base.groups]
    stem = next(g for g in groups if stem_relu in g)
    nxt = next(g for g in groups if stem_relu + 1 in g)
    conv_only = [stem_relu + 1]
    groups = [g for g in groups if g is not stem and g is not nxt]
    groups += [stem + conv_only, [n for n in nxt if n not in conv_only]]
    plan = plan_from_groups(graph, groups, hw, planner="hand-made")
    compiled = tf.compile_model(model, hw, plan=plan)
    vm = tvm.relax.VirtualMachine(compiled.executable, tvm.cpu())
    inputs = random_inputs(model.inputs, seed=4)
    got = vm["main"](tvm.runtime.tensor(inputs[0])).numpy()
    assert max_rel_error(got, run_onnxruntime(model.onnx_model, inputs)[0]) <= 1e-4


def test_non_convex_group_is_refused(graph):
    hw = tf.load_target("host")
    ops = [n.op for n in graph.nodes]
    relu = ops.index("relu")
    conv2 = ops.index("conv2d1")
    # The stem ReLU with the residual Add but without the conv between them.
    add = next(n.id for n in graph.nodes if relu in n.inputs and n.id != conv2)
    groups = [[relu, add]] + [[n.id] for n in graph.nodes if n.id not in (relu, add)]
    plan = plan_from_groups(graph, groups, hw, planner="hand-made")
    with pytest.raises(PlanError, match="not convex"):
        apply_plan(graph, plan)


def test_plan_for_another_graph_is_refused(graph):
    other = tf.build_graph(tf.import_model(build_embedded_model(), name="x",
                                           simplify=False).mod)
    plan = tf.plan_fusion(graph, "host")
    assert other.signature == graph.signature  # same model: same signature
    bad = FusionPlan(target=plan.target, graph_signature="0" * 16, planner=plan.planner,
                     groups=plan.groups)
    with pytest.raises(PlanError, match="Re-plan"):
        apply_plan(graph, bad)
    partial = FusionPlan(target=plan.target, graph_signature=plan.graph_signature,
                         planner=plan.planner, groups=plan.groups[1:])
    with pytest.raises(PlanError, match="missing"):
        apply_plan(graph, partial)


def _sigmoid_workload(n=64):
    x = te.placeholder((1, n), "float32", name="x")
    y = te.compute((1, n), lambda i, j: te.sigmoid(x[i, j]), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y]).with_attr("global_symbol", "main")})


def test_verifier_accepts_a_correct_schedule_and_rejects_a_wrong_kernel():
    target = tf.load_target("host").tvm_target()
    workload = _sigmoid_workload()
    sch = tvm.s_tir.Schedule(workload)
    i, j = sch.get_loops(sch.get_sblock("y"))
    jo, ji = sch.split(j, [None, 16])
    sch.vectorize(ji)
    verifier = KernelVerifier(target)
    verdict = verifier.check(0, workload, sch.mod)
    assert verdict.error is None and verdict.default_us > 0 and verdict.candidate_us > 0

    x = te.placeholder((1, 64), "float32", name="x")
    wrong = te.compute((1, 64), lambda i, j: x[i, j] * 0.5, name="y")
    bad = tvm.IRModule({"main": te.create_prim_func([x, wrong]).with_attr("global_symbol", "main")})
    verdict = verifier.check(0, workload, bad)
    assert not verdict.accepted and "differs from the reference" in verdict.error


@pytest.mark.parametrize("candidate, default, faster", [
    ([50.0], [100.0], True),                     # clearly faster: one round decides
    ([95.0, 96.0, 95.5, 96.0], [100.0, 101.0, 100.0], True),  # 5% with 1% noise
    ([98.0, 98.0, 98.5, 98.0], [100.0, 100.0, 100.0], False),  # 2%: under the floor
    ([90.0, 125.0, 130.0, 95.0], [100.0, 100.0, 101.0], False),  # 10% inside 30% noise
    ([120.0], [100.0], False),                   # slower
])
def test_a_candidate_must_beat_the_default_by_more_than_the_noise(candidate, default, faster):
    got, margin = faster_than_default(candidate, default)
    assert got is faster and margin >= 0.03


def test_module_call_by_name_and_input_errors(model, tmp_path):
    compiled = tf.compile_model(model, "host")
    path = compiled.export(tmp_path / "m.so")
    mod = tf.load_module(path)
    assert [i.name for i in mod.input_info] == ["image"]
    assert mod.input_info[0].shape == (1, 3, 32, 32)
    x = random_inputs(model.inputs, seed=5)[0]
    a = mod(x)[0]
    b = mod(image=x)[0]
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ModuleLoadError, match="image.*shape"):
        mod(np.zeros((1, 3, 16, 16), "float32"))
    with pytest.raises(ModuleLoadError, match="no input named 'img'"):
        mod(img=x)
    with pytest.raises(ModuleLoadError, match="no compiled module"):
        tf.load_module(tmp_path / "missing.so")
