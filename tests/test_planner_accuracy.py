"""benchmarks.planner_accuracy: predicted vs measured tuned kernel times from the logs."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import planner_accuracy as pa
from tvm_fusion.data import shipped_logs_dir
from tvm_fusion.plan.cost import OP_CLASSES


def test_spearman_and_median_error_by_hand():
    assert pa.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert pa.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks 1..4 against 1, 3, 2, 4: 1 - 6 * (0 + 1 + 1 + 0) / (4 * 15) = 0.8
    assert pa.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(pa.spearman([1], [2]))
    rows = [{"pred_us": 2.0, "meas_us": 1.0, "ratio": 2.0},
            {"pred_us": 3.0, "meas_us": 4.0, "ratio": 4 / 3},
            {"pred_us": 9.0, "meas_us": 10.0, "ratio": 10 / 9}]
    assert pa.summary(rows) == {"spearman": 1.0, "median_error": round(4 / 3, 4), "kernels": 3}


def test_shipped_x86_logs_give_one_row_per_measured_kernel(capsys):
    assert pa.main(["--logs", str(shipped_logs_dir() / "x86_zen4")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(lines[-1])
    # the embedded model's 5 kernels, 3 of them with a measured record
    assert doc["kernels"] == len(lines) - 2 == 3
    assert set(doc) == {"spearman", "median_error", "kernels", "per_model", "per_class"}
    assert sum(c["kernels"] for c in doc["per_class"]) == 3
    assert {c["class"] for c in doc["per_class"]} <= set(OP_CLASSES)
    assert doc["median_error"] >= 1.0 and -1.0 <= doc["spearman"] <= 1.0
    assert all(" x86_zen4 " in line for line in lines[1:-1])


def test_per_class_table_and_the_goal_by_hand():
    rows = [{"class": "conv", "pred_us": 100.0, "meas_us": 80.0, "ratio": 1.25},
            {"class": "conv", "pred_us": 10.0, "meas_us": 12.0, "ratio": 1.2},
            {"class": "elementwise/memory", "pred_us": 1.0, "meas_us": 3.0, "ratio": 3.0}]
    [conv, elem] = pa.class_table(rows)
    assert conv["class"] == "conv" and conv["kernels"] == 2
    assert conv["median_error"] == pytest.approx(1.225) and conv["spearman"] == 1.0
    assert elem["p90_error"] == 3.0
    # median 1.25, Spearman 1, the one kernel over 10% of 95 us within 2x: the goal holds
    g = pa.goal(rows)
    assert g["goal"] and g["big_kernels"] == 2 and g["worst_big_error"] == 1.25
    rows[0] = {**rows[0], "pred_us": 200.0, "ratio": 2.5}  # the big kernel 2.5x off
    assert not pa.goal(rows)["goal"]


def test_a_directory_without_logs_is_exit_2(tmp_path, capsys):
    assert pa.main(["--logs", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_a_model_tuned_with_an_input_fixed_is_reimported_with_it(tmp_path):
    """silero-vad is tuned with ``--const sr=16000`` (its If folds to one branch): the
    manifest keeps the value, and the accuracy report re-imports the model with it
    (without it the import raised a PlanError out of the report)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    import tvm_fusion as tf
    from tvm_fusion.costmodel import group_data
    from tvm_fusion.plan import plan_model
    from tvm_fusion.logs.manifest import ModelEntry

    graph = helper.make_graph(  # y = x * exp(s): with s fixed, exp(s) folds at import
        [helper.make_node("Exp", ["s"], ["e"]), helper.make_node("Mul", ["x", "e"], ["y"])],
        "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    path = tmp_path / "scaled.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = tf.import_model(path, consts={"s": np.float32([2.0])})
    _, plan = plan_model(model.mod, tf.load_target("host"))
    entry = {"source": str(path), "inputs": {"x": [4, 8]}, "consts": {"s": [2.0]}}
    host = tf.load_target("host")
    assert group_data._graph_for(ModelEntry.from_json(entry), plan, host) is not None
    assert group_data._graph_for(ModelEntry.from_json({**entry, "consts": {}}), plan,
                                 host) is None  # s an input
