"""Smoke test of the benchmark harness: the embedded model, 2 trials, every system.

It runs ``python -m benchmarks.run`` in a fresh process (as a user would) and checks the
structure of what it writes, never the timings. To stay near a minute on 2 cores it
times 2 short rounds and gives stock MetaSchedule's builder a 1 s timeout and its search
a population of 16: its workers' start-up (importing ``tvm.s_tir.tensor_intrin``) takes
longer than that on a small machine, so its builds time out fast and its row is the
unscheduled FuseOps build, with the timeouts and the population in its notes. That path
is the one to check here; the tuned path is what the manual smoke runs in
benchmarks/METHODS.md show.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(REPO))

from benchmarks.report import COLUMNS, JSON_NAME, MD_NAME, PNG_NAME  # noqa: E402
from benchmarks.systems import FROM_LOGS, FUSION, KEYS, MS, ORT, PLAIN, TORCH, labels  # noqa: E402
# Two trials over the embedded model's 7 kernels: enough for a measured record in the
# logs, the curves and the from-logs row, and each trial costs a builder batch.
TRIALS = 2
# Stock MetaSchedule's evolutionary search samples and evolves 512 schedules per task even
# for one trial (8-25 s a task here, most of both smokes' time); 16 keeps its search, its
# pipeline and its rows (prepack, max_trials_per_task) as they are, in about a second.
MS_POPULATION = 16


def _table(md: str, model: str) -> dict[str, dict[str, str]]:
    """The per-model table of RESULTS.md: system label -> {column: cell}."""
    section = md.split(f"\n## {model}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(COLUMNS), header
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        assert len(cells) == len(COLUMNS), ln
        rows[cells[0]] = dict(zip(COLUMNS, cells))
    return rows


def test_harness_smoke_on_embedded_model(tmp_path):
    out = tmp_path / "bench"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # Stock MetaSchedule's builds time out at 1 s (its workers' start-up is longer), so its
    # row is FuseOps' unscheduled kernels: enough for the harness's structure, and one
    # builder batch per task (max_trials_per_task) costs 1 s instead of 10.
    cmd = [sys.executable, "-m", "benchmarks.run", "--models", "embedded", "--trials",
           str(TRIALS), "--out", str(out), "--rounds", "2", "--slot-ms", "100",
           "--ms-builder-timeout", "1", "--ms-population", str(MS_POPULATION),
           "--ms-per-task", "2"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"harness failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "embedded: timing" in proc.stdout  # progress is printed

    md = (out / MD_NAME).read_text()
    data = json.loads((out / JSON_NAME).read_text())
    png = (out / PNG_NAME).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    names = labels(TRIALS)
    table = _table(md, "embedded")
    assert set(table) == {names[k] for k in KEYS}, sorted(table)
    rows = {r["key"]: r for r in data["models"][0]["rows"]}
    assert list(rows) == list(KEYS)

    # ONNX Runtime is the reference; the TVM-based systems all ran and were checked.
    assert rows[ORT]["status"] == "ok" and table[names[ORT]]["max rel err"] == "reference"
    for key in (PLAIN, MS, FUSION, FROM_LOGS):
        assert rows[key]["status"] in ("ok", "untimed"), (key, rows[key])
        assert rows[key]["max_err"] <= 1e-4
        assert float(table[names[key]]["max rel err"]) <= 1e-4
        assert int(table[names[key]]["kernels (untuned)"].split()[0]) > 0
    # PyTorch: checked when torch and onnx2torch are installed, else says why not.
    assert rows[TORCH]["status"] in ("ok", "unavailable"), rows[TORCH]
    if rows[TORCH]["status"] == "ok":
        assert float(table[names[TORCH]]["max rel err"]) <= 1e-4
    else:
        assert table[names[TORCH]]["median ms"].startswith("unavailable: ")

    # Timed rows have a latency, a ratio to tvm-fusion and a multiple of the floor.
    for key in (ORT, PLAIN, MS, FUSION):
        cells = table[names[key]]
        assert float(cells["median ms"]) > 0 and float(cells["x floor"]) > 0, cells
        assert float(cells["x tvm-fusion"]) > 0, cells
    assert table[names[FUSION]]["x tvm-fusion"] == "1.00"
    assert float(table[names[FUSION]]["tune s"]) > 0
    assert rows[FROM_LOGS]["status"] == "untimed"  # same logs as tvm-fusion: compile only

    model = data["models"][0]
    assert model["floor_ms"] > 0 and model["cost"]["flops"] > 0
    assert data["machine"]["peak_gflops"] > 0 and data["machine"]["bandwidth_gbs"] > 0
    assert model["curves"]["tvm-fusion"]["records"] == TRIALS
    assert model["curves"]["metaschedule"]["records"] >= 1
    # the curve has the tasks MetaSchedule tuned (its builds time out here, so nothing is
    # measured; tests/test_stock_ms.py checks the curve against a measured database)
    ms_curve, ms_facts = model["curves"]["metaschedule"], rows[MS]["extra"]
    assert ms_curve["tasks"] == ms_facts["workloads"], (ms_curve, ms_facts)
    assert "builder batches" in table[names[MS]]["notes"]
    assert f"population {MS_POPULATION}" in table[names[MS]]["notes"]  # the knob is reported
    assert data["settings"]["ms_population"] == MS_POPULATION
    # the per-task budget is the one asked for (tvm-fusion's, when the task counts differ)
    assert data["settings"]["ms_per_task"] == 2
    assert "max_trials_per_task=2 over" in table[names[MS]]["notes"]

    # --ms-resume times the same MetaSchedule database again: no trial is added to it.
    db = out / "work" / "embedded" / "metaschedule" / "database_tuning_record.json"
    records = db.read_text().count("\n")
    again = cmd + ["--systems", f"{ORT},{MS},{FUSION}", "--resume", "--ms-resume"]
    proc = subprocess.run(again, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"re-time failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    ms_row = {r["key"]: r for r in json.loads((out / JSON_NAME).read_text())
              ["models"][0]["rows"]}[MS]
    assert ms_row["status"] == "ok" and ms_row["max_err"] <= 1e-4, ms_row
    assert any("applied the database of an earlier run" in n for n in ms_row["notes"])
    assert db.read_text().count("\n") == records


def _pretrained_table(md: str) -> dict[str, dict[str, str]]:
    """The table of RESULTS-pretrained.md: system label -> {column: cell}."""
    from benchmarks.pretrained import COLUMNS as P_COLUMNS

    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(P_COLUMNS), header
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        assert len(cells) == len(P_COLUMNS), ln
        rows[cells[0]] = dict(zip(P_COLUMNS, cells))
    return rows


def test_pretrained_benchmark_smoke(tmp_path, capsys):
    """benchmarks/pretrained.py at tiny budgets: every row runs, is checked and timed.

    Stock MetaSchedule's builder gets a 1 s timeout (shorter than its workers' start-up,
    see the module docstring): its builds all time out fast and its rows are FuseOps'
    unscheduled kernels, which is enough to check the structure; the tuned path is the
    smoke run in benchmarks/METHODS.md. One run of the benchmark's ``main`` in this process
    (the harness smoke above checks the fresh-process ``python -m`` path; this one's import
    would cost a fifth of it), then its ``--ms-from`` path and usage errors (no
    re-tuning).
    """
    from benchmarks import pretrained
    from benchmarks.pretrained import DEFAULT_COST_MODEL, JSON_NAME as P_JSON, MD_NAME as P_MD

    # A missing cost model is a clear error before any work, not a traceback.
    assert pretrained.main(["--model", "embedded", "--cost-model", str(tmp_path / "none.json"),
                            "--out", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    if not DEFAULT_COST_MODEL.is_file():
        pytest.skip(f"the shipped cost model {DEFAULT_COST_MODEL} does not exist")

    out = tmp_path / "pretrained"
    # a handler without a name on MetaSchedule's logger (test_explore's tuning leaves one
    # when the suite runs it first) crashed the stock peer's logger set-up
    stray = logging.NullHandler()
    logging.getLogger("tvm.s_tir.meta_schedule").addHandler(stray)
    status = pretrained.main(["--model", "embedded", "--per-task", "1,2", "--ms-per-task", "1",
                              "--no-ms-same-budget", "--out", str(out), "--rounds", "2",
                              "--slot-ms", "100", "--ms-builder-timeout", "1",
                              "--ms-population", str(MS_POPULATION)])
    logging.getLogger("tvm.s_tir.meta_schedule").removeHandler(stray)
    printed = capsys.readouterr()
    assert status == 0, f"failed:\n{printed.out[-3000:]}\n{printed.err[-3000:]}"
    data = json.loads((out / P_JSON).read_text())
    table = _pretrained_table((out / P_MD).read_text())
    n = data["settings"]["n_tasks"]
    assert n > 0
    assert list(table) == ["ONNX Runtime (CPU EP, reference)", "MetaSchedule (1/task)",
                           "tvm-fusion + pretrained model (1/task)",
                           "tvm-fusion + pretrained model (2/task)"], list(table)
    for label, cells in table.items():
        assert cells["status"] == "ok", (label, cells)
        assert float(cells["max rel err"]) <= 1e-4, (label, cells)
        assert float(cells["median ms"]) > 0, (label, cells)
    ours1 = table["tvm-fusion + pretrained model (1/task)"]
    ours2 = table["tvm-fusion + pretrained model (2/task)"]
    # the peer as TVM's docs run it on a CPU: every task gets its per-task budget, weights
    # prepacked (max_trials_per_task, cpu_weight_prepack)
    assert table["MetaSchedule (1/task)"]["total trials"] == str(n)
    assert table["MetaSchedule (1/task)"]["x MetaSchedule-64"] == "1.00"
    assert ours1["total trials"] == str(n) and ours2["total trials"] == str(2 * n)
    # cumulative: the second budget resumes the first's logs, its wall time includes it
    assert 0 < float(ours1["tuning wall s"]) <= float(ours2["tuning wall s"])
    rows = {(r["key"], r["extra"].get("per_task")): r for r in data["rows"]}
    assert rows[("tvm-fusion-pretrained", 2)]["extra"]["total_trials"] == 2 * n
    peer = rows[("metaschedule", 1)]["extra"]
    assert peer["prepack"] is True and peer["per_task"] == 1 and peer["tasks"] == n
    assert peer["population"] == MS_POPULATION
    assert any(s.startswith("trials per task ours needs to come within 5% of "
                            "MetaSchedule's result: ") for s in data["summary"])
    assert "trials per task ours needs" in printed.out  # the table is printed too

    # --ms-from: stock MetaSchedule re-built from that run's databases, no new trial. Run
    # in this process through the harness's own steps (parse_args reads the earlier run,
    # ms_row applies its database, run_system checks it against ONNX Runtime): a second
    # `python -m benchmarks.pretrained` would re-tune our rows too, a third of this test.
    from benchmarks import models as model_registry
    from benchmarks.systems import Context, Row, prepare_ort, run_system
    from tvm_fusion import load_target

    args = pretrained.parse_args(["--model", "embedded", "--ms-per-task", "1",
                                  "--out", str(tmp_path / "again"), "--ms-from", str(out),
                                  "--ms-builder-timeout", "1"])
    assert args.ms_earlier["settings"]["n_tasks"] == n
    model = model_registry.load("embedded")
    ctx = Context(model=model, inputs=model.inputs(), hw=load_target(data["settings"]["target"]),
                  trials=0, work=tmp_path / "again" / "work" / "embedded", logs=None,
                  ms_builder_timeout=args.ms_builder_timeout)
    _call, outputs = prepare_ort(ctx, Row("onnxruntime", "ONNX Runtime"))
    new, prepare = pretrained.ms_row(pretrained.MS_KEY, "MetaSchedule (1/task)", 1, n, ctx,
                                     args.ms_earlier, args.ms_from)
    run_system(prepare, None, new, outputs(), pretrained.TOL, log=lambda _msg: None)
    old = next(r for r in data["rows"] if r["key"] == "metaschedule")
    assert new.status == "ok" and new.max_err <= 1e-4, (new.status, new.reason)
    assert new.tune_s == old["tune_s"] and new.call is not None  # ready to be timed
    assert new.extra["reused_from"].startswith(str(out))
    assert new.extra["records"] == old["extra"]["records"]  # nothing re-tuned
    # A run with another MetaSchedule budget cannot reuse it: a usage error (exit 2).
    with pytest.raises(SystemExit) as exc:
        pretrained.parse_args(["--model", "embedded", "--ms-per-task", "3",
                               "--out", str(tmp_path / "bad"), "--ms-from", str(out)])
    assert exc.value.code == 2 and "ms_per_task" in capsys.readouterr().err
