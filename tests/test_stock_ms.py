"""The harness names stock MetaSchedule's wrong kernels (MetaSchedule verifies nothing).

The wrong record here is a real TVM 0.27 defect, the one that broke ppocr-rec's
conv + concatenate kernel (issue 19, run 9): ``reverse_compute_at`` of a concatenate at
a conv's channel tile narrows the concatenate to the conv's channels, so the channels
copied from the other input are never written.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, te, topi
from tvm.s_tir import meta_schedule as ms

from benchmarks.stock_ms import wrong_kernels
from benchmarks.systems import explain_wrong


def _conv_concat() -> tvm.IRModule:
    x = te.placeholder((1, 8, 4, 4), name="x")
    w = te.placeholder((16, 8, 1, 1), name="w")
    y = te.placeholder((1, 16, 4, 4), name="y")
    out = topi.concatenate([y, topi.nn.conv2d_nchw(x, w, 1, 0, 1)], axis=1)
    return tvm.IRModule({"main": te.create_prim_func([x, w, y, out])})


def _database(work, mod, concat_under_tile: bool):
    sch = s_tir.Schedule(mod)
    outer, _ = sch.split(sch.get_loops(sch.get_sblock("conv2d_nchw"))[1], [2, 8])
    if concat_under_tile:
        sch.reverse_compute_at(sch.get_sblock("T_concat"), outer)
    db = ms.database.JSONDatabase(str(work / "database_workload.json"),
                                  str(work / "database_tuning_record.json"))
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod),
                                                     [2e-5]))


def test_a_concatenate_under_the_conv_tile_is_named_as_wrong(tmp_path):
    _database(tmp_path, _conv_concat(), concat_under_tile=True)
    target = tvm.target.Target("llvm")
    wrong = wrong_kernels(tmp_path, target)
    assert len(wrong) == 1, wrong
    assert wrong[0]["blocks"] == ["pad_temp", "conv2d_nchw", "T_concat"]
    assert wrong[0]["max_rel_err"] > 0.1  # half the output is never written
    assert wrong[0]["run_us"] == 20.0 and wrong[0]["correct_records"] == 0
    note = explain_wrong(tmp_path, target)
    assert note.startswith("1 tuned kernel(s) wrong on their own")
    assert "pad_temp+conv2d_nchw+T_concat" in note


def test_a_correct_record_is_not_named(tmp_path):
    _database(tmp_path, _conv_concat(), concat_under_tile=False)
    assert wrong_kernels(tmp_path, tvm.target.Target("llvm")) == []
    assert "every tuned kernel matches" in explain_wrong(tmp_path, tvm.target.Target("llvm"))


def _conv_model():
    """One conv with constant weights: a task whose weight ``cpu_weight_prepack`` marks."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        initializer=[numpy_helper.from_array(w, "w")])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_tuning_curve_finds_the_tasks_tuned_with_prepacked_weights(tmp_path):
    """The curve extracts the tasks as ``static_shape_tuning(cpu_weight_prepack=True)``
    tuned them (weights layout-free, other workload hashes); extracted the plain way, no
    task matches the database and the curve says nothing was measured (run 9's curves)."""
    from benchmarks.stock_ms import tune_and_build
    from tvm_fusion.explore.tuning import metaschedule_curve
    from tvm_fusion.simplify import import_model

    from tvm_fusion.targets import as_target

    model = import_model(_conv_model(), name="conv")
    target = as_target("host").tvm_target()  # with -num-cores, as MetaSchedule needs
    # the benchmarks' builder timeout (180 s): each batch's fresh builder workers import
    # tvm.s_tir.tensor_intrin, 32 s on a Zen 2, past MetaSchedule's 30 s default, and every
    # candidate timed out there (CI); 4 trials so a lone failing candidate leaves others
    _, facts = tune_and_build(model.mod, target, tmp_path, trials=4, per_task=4,
                              builder_timeout=180, prepack=True, population=16)
    assert facts["workloads_with_record"] == facts["workloads"] > 0, facts
    curve = metaschedule_curve(model, "host", tmp_path, prepack=True, baseline=False)
    assert curve.tasks == facts["workloads"] and curve.unmeasured == 0, curve
    assert curve.trials and curve.est_ms[-1] > 0
    plain = metaschedule_curve(model, "host", tmp_path, prepack=False, baseline=False)
    assert plain.unmeasured == plain.tasks, plain
