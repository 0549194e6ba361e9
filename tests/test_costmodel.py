"""The learned cost model: dataset, training, save/load, eval, and its use in tuning.

The fixture under tests/data/costmodel/ is a slice of a stock MetaSchedule database
measured on the development machine (x86_zen4): three kernels of the embedded model
(matmul+add, matmul+sigmoid*mul, mean), 12 measured candidates each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tvm_fusion.cli import main
from tvm_fusion.costmodel import (CostModelError, load_dataset, load_model, make_cost_model,
                                  ranking_metrics, split_holdout, split_within,
                                  train_model)
from tvm_fusion.targets import load_target

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = Path(__file__).parent / "data" / "costmodel"
HW = "x86_zen4"


@pytest.fixture(scope="module")
def dataset():
    from tvm_fusion.compat.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()
    return load_dataset([FIXTURE], load_target(HW))


@pytest.fixture(scope="module")
def trained(dataset):
    return train_model(dataset, rounds=40)


def test_dataset_reads_every_record(dataset):
    assert len(dataset) == 36
    assert len(dataset.workloads) == 3
    assert dataset.skipped == {}
    assert dataset.counts.sum() == len(dataset.stores)
    assert (dataset.latency_s > 0).all()


def test_corrupt_lines_are_skipped_and_counted(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "db")
    with open(tmp_path / "db" / "database_tuning_record.json", "a") as f:
        f.write("[0, [not json\n")
        f.write(json.dumps([0, [[[["NoSuchInstruction", [], [], []]], []], [1e-5],
                                {"kind": "llvm"}, []]]) + "\n")
        f.write(json.dumps([0, [[[], []], [1e10], {"kind": "llvm"}, []]]) + "\n")
    with open(tmp_path / "db" / "database_workload.json", "a") as f:
        f.write("garbage\n")
    data = load_dataset([tmp_path], load_target(HW))
    assert len(data) == 36
    assert data.skipped["corrupt workload lines"] == 1
    assert data.skipped["corrupt record lines"] + data.skipped.get("unreplayable traces", 0) == 2
    assert data.skipped["failed measurements"] == 1


def test_ranking_metrics_by_definition():
    lat = np.array([1.0, 2.0, 4.0, 3.0, 1.0, 5.0])
    wl = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    perfect = -lat
    m = ranking_metrics(perfect, lat, wl)
    assert m["pairwise_accuracy"] == 1.0 and m["pooled_pairwise_accuracy"] == 1.0
    assert m["pairs"] == 4 and m["workloads"] == 2  # "c" has a single candidate
    assert m["top1"] == 1.0 and m["top5"] == 1.0
    m = ranking_metrics(lat, lat, wl)  # exactly reversed
    assert m["pairwise_accuracy"] == 0.0 and m["pooled_pairwise_accuracy"] == 0.0
    # TenSet's peak score, weighted by candidates: a picks 4.0 (best 1.0) -> 0.25, then
    # 2.0 -> 0.5, then 1.0 -> 1; b picks 3.0 -> 1/3, then 1.0 -> 1.
    assert m["top1"] == pytest.approx((3 * 0.25 + 2 / 3) / 5)
    assert m["top5"] == pytest.approx((3 * (0.25 + 0.5 + 1) / 3 + 2 * (1 / 3 + 1) / 2) / 5)
    # per workload, weighted by candidates: a big workload does not count n^2 times
    lat2 = np.concatenate([np.arange(1.0, 7.0), [1.0, 2.0]])
    wl2 = np.array(["big"] * 6 + ["small"] * 2, dtype=object)
    scores = np.concatenate([-lat2[:6], lat2[6:]])  # big ranked right, small reversed
    m = ranking_metrics(scores, lat2, wl2)
    assert m["pairwise_accuracy"] == pytest.approx(6 / 8)
    assert m["pooled_pairwise_accuracy"] == pytest.approx(15 / 16)


def test_train_save_load_eval_round_trip(dataset, trained, tmp_path):
    m = trained.meta["metrics"]["train"]
    assert m["pairwise_accuracy"] > 0.75  # it learned something on its own data
    for suffix in (".json", ".ubj"):
        path = trained.save(tmp_path / f"model{suffix}")
        back = load_model(path)
        np.testing.assert_allclose(back.predict(dataset), trained.predict(dataset), rtol=1e-6)
        assert back.meta["feature_version"] == trained.meta["feature_version"]
        assert back.meta["data"]["candidates"] == 36
        assert back.train_workloads == frozenset(dataset.workloads)
        assert back.evaluate(dataset) == pytest.approx(trained.evaluate(dataset))
    assert not list(tmp_path.glob("*.pkl"))


def test_holdout_leaves_workloads_out_of_training(dataset):
    train, held = split_holdout(dataset, "0.34")
    assert len(held.workloads) == 1 and len(train.workloads) == 2
    assert not set(held.workloads) & set(train.workloads)
    model = train_model(train, rounds=10, holdout=held)
    assert model.meta["metrics"]["holdout"]["candidates"] == 12
    assert set(model.meta["train_workloads"]) == set(train.workloads)
    with pytest.raises(CostModelError, match="matches no database path"):
        split_holdout(dataset, "no-such-model")


def test_within_split_holds_out_part_of_every_workload(dataset, tmp_path, capsys):
    """TenSet's within_task protocol: every kernel stays in training, a share of each
    kernel's candidates is held out, no candidate is on both sides."""
    train, held = split_within(dataset, 0.25, seed=3)
    assert len(train) == 27 and len(held) == 9  # 12 per kernel: int(12 * 0.75) = 9 kept
    assert set(train.workloads) == set(held.workloads) == set(dataset.workloads)
    key = lambda d: set(zip(d.workload.tolist(), d.latency_s.tolist()))
    assert not key(train) & key(held)
    again, _ = split_within(dataset, 0.25, seed=3)
    np.testing.assert_array_equal(again.latency_s, train.latency_s)  # seeded
    with pytest.raises(CostModelError, match="fraction"):
        split_within(dataset, 1.5)
    model = tmp_path / "w.json"
    assert main(["cost-model", "train", "--logs", str(FIXTURE), "--target", HW, "--split",
                 "within", "--holdout", "0.25", "--rounds", "10", "-o", str(model)]) == 0
    out = capsys.readouterr().out
    assert "held out: 9 candidates (0.25 of each workload's)" in out
    assert "within_task" in out and "3 workloads with 2+ candidates" in out
    meta = json.loads((tmp_path / "w.json.meta.json").read_text())
    assert meta["data"]["holdout_split"] == "within"
    assert meta["metrics"]["holdout"]["candidates"] == 9
    assert main(["cost-model", "train", "--logs", str(FIXTURE), "--target", HW, "--split",
                 "within", "--holdout", "ppocr-cls", "-o", str(model)]) == 2
    assert "must be a number" in capsys.readouterr().err


def test_other_feature_version_is_a_clear_error(trained, tmp_path):
    path = trained.save(tmp_path / "model.json")
    side = tmp_path / "model.json.meta.json"
    meta = json.loads(side.read_text())
    meta["feature_version"] = 999
    side.write_text(json.dumps(meta))
    with pytest.raises(CostModelError, match="feature version 999.*Re-train"):
        load_model(path)
    side.unlink()
    with pytest.raises(CostModelError, match="no sidecar"):
        load_model(path)


def test_cli_train_and_eval_on_unseen_workloads(tmp_path, capsys):
    # Train on two of the three kernels, evaluate on the third.
    db = tmp_path / "two"
    db.mkdir()
    wl = (FIXTURE / "database_workload.json").read_text().splitlines(keepends=True)
    recs = [r for r in (FIXTURE / "database_tuning_record.json").read_text().splitlines(
        keepends=True) if json.loads(r)[0] < 2]
    (db / "database_workload.json").write_text("".join(wl))
    (db / "database_tuning_record.json").write_text("".join(recs))
    model = tmp_path / "m.json"
    assert main(["cost-model", "train", "--logs", str(db), "--target", HW, "--rounds", "20",
                 "-o", str(model)]) == 0
    out = capsys.readouterr().out
    assert "24 measured candidates of 2 workloads" in out
    assert main(["cost-model", "eval", str(model), "--logs", str(FIXTURE),
                 "--target", HW]) == 0
    out = capsys.readouterr().out
    assert "2 workloads were in the model's training set" in out
    assert "evaluating on 1 held-out workloads" in out
    assert "pairwise accuracy" in out and "over 66 pairs" in out
    # every workload seen in training: nothing to evaluate, said plainly
    assert main(["cost-model", "eval", str(model), "--logs", str(db), "--target", HW]) == 2
    assert "was in" in capsys.readouterr().err
    # fine-tuning (--base): the two-kernel model plus 5 rounds on all three kernels; the
    # base's kernels count as seen, so held out are only those it never saw
    tuned = tmp_path / "ft.json"
    assert main(["cost-model", "train", "--logs", str(FIXTURE), "--target", HW, "--base",
                 str(model), "--rounds", "5", "--holdout", "0.67", "-o", str(tuned)]) == 0
    out = capsys.readouterr().out
    assert "fine-tuning" in out and "(20 rounds" in out
    meta = json.loads((tmp_path / "ft.json.meta.json").read_text())
    base = json.loads((tmp_path / "m.json.meta.json").read_text())
    assert meta["rounds"] == 25 and load_model(tuned).booster.num_boosted_rounds() == 25
    assert meta["base"]["new_rounds"] == 5 and meta["base"]["data"]["workloads"] == 2
    assert set(base["train_workloads"]) <= set(meta["train_workloads"])
    # two of three kernels held out, the base knew two: at least one is not counted, and
    # the held-out metrics count exactly the kernels neither the base nor the new trees saw
    assert "not counted" in out and len(meta["train_workloads"]) in (2, 3)
    unseen = 3 - len(meta["train_workloads"])
    assert meta["metrics"].get("holdout", {}).get("workloads", 0) == unseen


def test_pretrained_cost_model_predicts_and_learns(dataset, trained):
    """The MetaSchedule wrapper on real candidates: scores in (0, 1] in the model's
    order, and an update boosts a copy on top of the pretrained trees."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion.costmodel.dataset import _read_database

    hw = load_target(HW)
    recs = [r for _, r in _read_database(FIXTURE, {})]
    wl = recs[0].workload
    mine = [r for r in recs if r.workload.mod.same_as(wl.mod)][:8]
    cands = [r.as_measure_candidate() for r in mine]
    ctx = ms.TuneContext(mod=wl.mod, target=hw.tvm_target())
    cm = make_cost_model(trained, hw, update_rounds=5)
    pred = cm.predict(ctx, cands)
    raw = cm.scores(ctx, cands)
    assert pred.shape == (8,) and (pred > 0).all() and pred.max() == 1.0
    assert (np.argsort(pred) == np.argsort(raw)).all()
    before = trained.predict(dataset)
    results = [ms.runner.RunnerResult(run_secs=[float(s) for s in r.run_secs], error_msg=None)
               for r in mine]
    cm.update(ctx, cands, results)
    assert cm.updates == 1
    assert cm.booster.num_boosted_rounds() == trained.booster.num_boosted_rounds() + 5
    np.testing.assert_array_equal(trained.predict(dataset), before)  # pretrained untouched
    failed = [ms.runner.RunnerResult(run_secs=None, error_msg="boom")] * len(cands)
    cm.update(ctx, cands, failed)  # failed runs teach nothing
    assert cm.updates == 1
    with pytest.warns(UserWarning, match="extrapolation"):  # an Ice Lake socket is not Zen 4
        make_cost_model(trained, load_target("x86_avx512"))


def test_tune_with_pretrained_model_fills_unmeasured_kernels(trained, tmp_path):
    """A tiny real tune with the pretrained model: the budget reaches only some kernels;
    the others get the model's pick, verified, in the deployable database."""
    import tvm_fusion as tf
    from tvm_fusion.embedded import build_embedded_model
    from tvm_fusion.logs.dirs import open_database

    hw = load_target("host")
    model = tf.import_model(build_embedded_model(), name="embedded")
    report = tf.tune(model, hw, trials=2, logs=tmp_path, progress=False,
                     search_options=tf.SearchOptions(cost_model=make_cost_model(trained, hw)))
    assert report.trials_run == 2
    unmeasured = [t for t in report.tasks if not t.trials]
    assert unmeasured, "the budget reached every kernel; the test needs fewer trials"
    manifest = json.loads((tmp_path / "host" / "manifest.json").read_text())
    entry = next(iter(manifest["models"].values()))
    predicted = entry.get("predicted", {})
    no_gain = entry.get("predicted_no_gain", {})
    # every unmeasured kernel's picks were built and checked: a verified pick faster than
    # the default deploys; picks all correct and no faster leave the default (on an Intel
    # AVX-512 machine the Zen 4 model's picks for this model all were)
    assert predicted or no_gain, "no unmeasured kernel got its picks checked"
    by_name = {t.name: t for t in report.tasks}
    for name, info in predicted.items():
        task = by_name[name]
        assert task.predicted and task.best_us == pytest.approx(info["verify_us"])
        assert info["verify_us"] < info["default_us"]  # accepted only when faster
    # a kernel the budget never reached got one (a measured kernel whose candidates all
    # lost to the default schedule may get one too)
    assert any(t.name in predicted or t.name in no_gain for t in unmeasured)
    db = open_database(tmp_path / "host", create=False)
    assert len(db.get_all_tuning_records()) >= len(predicted)
    # a second pass over the same log re-searches neither the kernels that got a pick nor
    # those whose picks were all no faster than the default loops
    again = tf.tune(model, hw, trials=2, logs=tmp_path, progress=False,
                    search_options=tf.SearchOptions(cost_model=make_cost_model(trained, hw)))
    skipped = set(predicted) | set(entry.get("predicted_no_gain", {}))
    assert not {p.task for p in again.picks} & skipped


def test_auto_picks_the_shipped_model_of_the_same_hardware(monkeypatch, tmp_path):
    """``cost_model="auto"`` (the default): the model shipped for the target's hardware,
    matched by TVM target; for a CPU no model ships for, the nearest CPU's; none for a
    GPU no model ships for; the env var overrides."""
    from tvm_fusion.config import COST_MODEL
    from tvm_fusion.targets import target_from_dict
    from tvm_fusion.tune.driver import default_cost_model, describe_cost_model

    monkeypatch.delenv(COST_MODEL.name, raising=False)
    shipped = ROOT / "tuning_logs" / "x86_zen4" / "costmodel.json"
    assert default_cost_model(load_target("x86_zen4")) == shipped
    assert default_cost_model(load_target("a100")) is None
    # a CPU no model ships for: the shipped CPU model of the same vector width, its own
    # mcpu line first (Zen 5 takes Zen 4's), else the first by name; never another width
    zen5 = load_target("x86_zen4").to_json_dict()
    zen5.update(name="x86_zen5", tvm_config={"value": {"kind": "llvm", "mcpu": "znver5",
                                                       "num-cores": 2}, "source": "a test"})
    assert default_cost_model(target_from_dict(zen5)) == shipped
    assert default_cost_model(load_target("x86_avx512")) == \
        ROOT / "tuning_logs" / "x86_emeraldrapids" / "costmodel.json"  # icelake-server
    assert default_cost_model(load_target("x86_avx2")) is None  # 256-bit vectors
    assert default_cost_model(load_target("mi250x")) is None  # GPUs: only their own
    h200 = ROOT / "tuning_logs" / "h200" / "costmodel.json"  # trained on the lent H200
    assert default_cost_model(load_target("h200")) == h200
    assert default_cost_model(load_target("h100")) == h200  # the same TVM target (sm_90)
    # Emerald Rapids (the machine of 2026-12): its own model, under its name and under any
    # description with its TVM target (``host`` there), not Zen 4's
    emerald = ROOT / "tuning_logs" / "x86_emeraldrapids" / "costmodel.json"
    assert default_cost_model(load_target("x86_emeraldrapids")) == emerald
    doc = load_target("x86_emeraldrapids").to_json_dict()
    doc.update(name="another_xeon", clock_ghz={"value": 3.0, "source": "a faster part"})
    assert default_cost_model(target_from_dict(doc)) == emerald
    assert describe_cost_model(emerald) == "tuning_logs/x86_emeraldrapids (shipped)"
    assert describe_cost_model(None).startswith("none (MetaSchedule's XGBoost")
    assert describe_cost_model(tmp_path / "m.json") == str(tmp_path / "m.json")
    for name, model in (("x86_zen4", shipped), ("x86_emeraldrapids", emerald)):
        if load_target("host").tvm_config == load_target(name).tvm_config:  # this machine
            assert default_cost_model(load_target("host")) == model
    monkeypatch.setenv(COST_MODEL.name, "none")
    assert default_cost_model(load_target("x86_zen4")) is None
    monkeypatch.setenv(COST_MODEL.name, str(tmp_path / "m.json"))
    assert default_cost_model(load_target("a100")) == tmp_path / "m.json"


def test_tune_cli_refuses_a_model_of_another_version(trained, tmp_path, capsys):
    path = trained.save(tmp_path / "m.json")
    side = tmp_path / "m.json.meta.json"
    side.write_text(side.read_text().replace('"feature_version": 1', '"feature_version": 0'))
    rc = main(["tune", "embedded", "--trials", "4", "--logs", str(tmp_path / "logs"),
               "--quiet", "--cost-model", str(path)])
    assert rc == 2
    assert "feature version" in capsys.readouterr().err
    assert not (tmp_path / "logs" / "host" / "candidates").exists()  # failed before tuning


def test_a_recalibrated_description_is_still_the_hardware_its_model_was_trained_on():
    """The shipped Zen 4 model was trained when x86_zen4 said 166 GFLOP/s and 43 GB/s;
    calibrated, it says 250 and 31 for the same machine: no extrapolation warning, as
    for a machine of other cores and caches there is (its trees never split on the
    hardware columns, so its ranking is the same either way)."""
    import warnings

    shipped = load_model(ROOT / "tuning_logs" / "x86_zen4" / "costmodel.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_cost_model(shipped, load_target("x86_zen4"))
    with pytest.warns(UserWarning, match="extrapolation"):
        make_cost_model(shipped, load_target("x86_avx512"))
