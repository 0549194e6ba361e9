"""The learned group-latency model: trained on measured records, saved without pickle,
used by the planner only through its predicted times, and analytical where data is thin.

The records are the shipped tuning_logs/x86_zen4 logs: the embedded model tuned on the
development machine, 3 kernels with a verified measured record (real measurements; a
fresh 4-trial tune costs 50 s on the shared cores, too much for the suite).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from tvm_fusion.cli import main
from tvm_fusion.costmodel.group_data import kernel_records, kernel_us, vm_call_us
from tvm_fusion.costmodel.group_model import (
    FEATURES, MIN_RECORDS, feature_matrix, group_features, load_group_model,
    train_group_model)
from tvm_fusion.data import shipped_logs_dir
from tvm_fusion.errors import CostModelError
from tvm_fusion.plan import plan_cost
from tvm_fusion.targets import load_target

LOGS = shipped_logs_dir() / "x86_zen4"


@pytest.fixture(scope="module")
def records():
    recs = kernel_records(LOGS)
    assert len(recs) == 3 and {r.model for r in recs} == {"embedded"}
    return recs


@pytest.fixture(scope="module")
def graph(records):
    return records[0].cost_model.graph


def _same_partition(a, b):
    return [g.nodes for g in a.groups] == [g.nodes for g in b.groups]


def test_trained_model_saves_as_xgboost_json_and_loads_back(records, tmp_path):
    gm = train_group_model(records, min_records=1)
    x = feature_matrix(records)
    assert x.shape == (3, len(FEATURES))
    for name in ("gm.json", "gm.ubj"):
        path = gm.save(tmp_path / name)
        meta = json.loads((tmp_path / f"{name}.meta.json").read_text())
        assert meta["schema"] == "tvm-fusion/group-model" and meta["features"] == list(FEATURES)
        hw = load_target("x86_zen4")
        assert meta["targets"] == {hw.hardware_hash: {"name": "x86_zen4", "records": 3}}
        assert meta["provenance"] == [{"logs": str(LOGS), "model": "embedded", "kernels": 3}]
        back = load_group_model(path)
        np.testing.assert_allclose(back.log_ratio(x), gm.log_ratio(x), rtol=1e-6)
    # xgboost's own JSON, never a pickle
    assert json.loads((tmp_path / "gm.json").read_text())["learner"]
    assert not (tmp_path / "gm.ubj").read_bytes().startswith(b"\x80")
    # the fit moves each kernel towards its measured time
    label = np.array([math.log(r.meas_us / r.analytical_us) for r in records])
    assert np.abs(gm.log_ratio(x) - label).sum() < np.abs(label).sum()


def test_a_model_of_another_schema_is_refused(records, tmp_path):
    path = train_group_model(records).save(tmp_path / "gm.json")
    side = tmp_path / "gm.json.meta.json"
    side.write_text(json.dumps({**json.loads(side.read_text()), "features": ["flops"]}))
    with pytest.raises(CostModelError, match="retrain it"):
        load_group_model(path)
    with pytest.raises(CostModelError, match="train-group-model"):
        load_group_model(tmp_path / "missing.json")


def test_records_of_logs_without_a_real_budget_are_not_trained_on(records):
    assert {r.trials_per_kernel for r in records} == {8.0}  # 40 trials, 5 kernels
    half = [dataclasses.replace(r, trials_per_kernel=0.5) if i else r
            for i, r in enumerate(records)]
    gm = train_group_model(half, min_records=1)
    assert gm.meta["kernels"] == 1 and gm.meta["untuned_skipped"] == 2
    with pytest.raises(CostModelError, match="fewer than 4 trials per kernel"):
        train_group_model(half[1:])


def test_the_planner_differs_from_the_analytical_one_only_through_the_times(records, graph):
    hw = load_target("x86_zen4")
    analytical = plan_cost(graph, hw)
    # measured == analytical: every prediction is exactly 0, every learned time the
    # analytical one, so the same plan with the same times
    flat = [dataclasses.replace(r, meas_us=r.analytical_us) for r in records]
    same = train_group_model(flat, min_records=1)
    learned = plan_cost(graph, hw, cost_model=same.cost_model(graph, hw))
    assert _same_partition(learned, analytical)
    assert [g.est_us for g in learned.groups] == pytest.approx(
        [g.est_us for g in analytical.groups], rel=1e-9)
    said = ["learned: 1.00x analytical from 3 records" in g.reason for g in learned.groups]
    assert sum(said) >= 3  # the rest lie outside the 3 kernels' range and say so
    assert all(ok or "outside the learned model's range" in g.reason
               or "no training kernel with" in g.reason for ok, g in zip(said, learned.groups))
    # measured == 3 x analytical everywhere: each group's kernel time (VM call excluded)
    # is the analytical one times the one predicted ratio
    slow = train_group_model([dataclasses.replace(r, meas_us=3 * r.analytical_us)
                              for r in records], min_records=1)
    ratio = float(np.exp(slow.log_ratio(feature_matrix(records[:1]))[0]))
    assert 2.5 < ratio < 3.0  # shrunk towards the prior (1x) by the regularization
    cm = slow.cost_model(graph, hw)
    plan = plan_cost(graph, hw, cost_model=cm)
    for g in plan.groups:
        base = cm.analytical.group_cost(g.nodes).total_us
        if "analytical: " in g.reason:
            assert g.est_us == base
            continue
        assert g.est_us == pytest.approx(kernel_us(base, hw) * ratio + vm_call_us(hw))
        assert f"learned: {ratio:.2f}x analytical from 3 records" in g.reason


def test_thin_data_falls_back_to_the_analytical_time_and_says_so(records, graph):
    gm = train_group_model(records)  # default: MIN_RECORDS
    zen4, avx2 = load_target("x86_zen4"), load_target("x86_avx2")
    plan = plan_cost(graph, avx2, cost_model=gm.cost_model(graph, avx2))
    assert _same_partition(plan, plan_cost(graph, avx2))
    assert [g.est_us for g in plan.groups] == [g.est_us for g in plan_cost(graph, avx2).groups]
    assert all("analytical: no learned model for x86_avx2" in g.reason for g in plan.groups)
    assert "analytical: no learned model for x86_avx2" in plan.explain(plan.groups[0].ops[0])
    cost = gm.cost_model(graph, zen4).group_cost(records[0].nodes)
    assert cost.source == f"analytical: 3 learned records for x86_zen4, fewer than {MIN_RECORDS}"
    assert cost.total_us == records[0].cost_model.group_cost(records[0].nodes).total_us
    # a group far outside the training range: analytical
    rich = train_group_model(records, min_records=1)
    feats = group_features(records[0].cost_model, records[0].nodes)
    assert rich.thin(zen4, feats) is None
    far = {**feats, "log_flops": rich.meta["ranges"]["log_flops"][1] + 3.0}
    assert "outside the learned model's range" in rich.thin(zen4, far)
    # a kind of group no training kernel was: the embedded model has no NCHWc conv
    assert rich.meta["support"]["blocked_layout"] == [0.0]
    blocked = {**feats, "blocked_layout": 1.0}
    assert rich.thin(zen4, blocked).startswith("no training kernel with blocked_layout = 1")


def test_cli_trains_and_plans_with_it(tmp_path, capsys):
    out = tmp_path / "gm.json"
    assert main(["train-group-model", "--logs", str(LOGS), "-o", str(out)]) == 0
    assert "x86_zen4: 3 measured kernels" in capsys.readouterr().out
    assert out.is_file() and (tmp_path / "gm.json.meta.json").is_file()
    assert main(["plan", "embedded", "--target", "x86_avx2", "--group-model", str(out)]) == 0
    assert "analytical: no learned model for x86_avx2" in capsys.readouterr().out
    assert main(["plan", "embedded", "--group-model", str(tmp_path / "nope.json")]) == 2
    assert "train-group-model" in capsys.readouterr().err
    assert main(["train-group-model", "--logs", str(LOGS), "-o", str(tmp_path / "m.pkl")]) == 2
    assert "-o" in capsys.readouterr().err


def test_auto_finds_the_environment_s_model_or_none(records, tmp_path, monkeypatch):
    from tvm_fusion.costmodel.cli import group_model_of

    path = train_group_model(records).save(tmp_path / "gm.ubj")
    monkeypatch.setenv("TVM_FUSION_GROUP_MODEL", str(path))
    assert group_model_of("auto").meta["kernels"] == 3
    monkeypatch.setenv("TVM_FUSION_GROUP_MODEL", "none")
    assert group_model_of("auto") is None and group_model_of("none") is None
