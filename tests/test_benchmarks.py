"""Smoke test of the benchmark harness: the embedded model, 4 trials, every system.

It runs ``python -m benchmarks.run`` in a fresh process (as a user would) and checks the
structure of what it writes, never the timings. To stay near a minute on 2 cores it
times 2 short rounds and gives stock MetaSchedule's builder a 10 s timeout: its workers'
start-up (importing ``tvm.s_tir.tensor_intrin``) takes longer than that on a small
machine, so its builds time out fast and its row is the unscheduled FuseOps build, with
the timeouts in its notes. That path is the one to check here; the tuned path is what
the manual smoke runs in benchmarks/README.md show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(REPO))

from benchmarks.report import COLUMNS, JSON_NAME, MD_NAME, PNG_NAME  # noqa: E402
from benchmarks.systems import FROM_LOGS, FUSION, KEYS, MS, ORT, PLAIN, TORCH, labels  # noqa: E402
TRIALS = 4


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
    cmd = [sys.executable, "-m", "benchmarks.run", "--models", "embedded", "--trials",
           str(TRIALS), "--out", str(out), "--rounds", "2", "--slot-ms", "100",
           "--ms-builder-timeout", "10"]
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
    assert "builder batches" in table[names[MS]]["notes"]
