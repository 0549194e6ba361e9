"""The command line as a user drives it: plan, tune (interrupted and resumed), compile, run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx

from tvm_fusion.embedded import build_embedded_model

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, check=True, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tvm_fusion", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_help_teaches_every_subcommand():
    out = cli("--help").stdout
    for sub in ("demo", "targets", "plan", "tune", "compile", "run"):
        assert sub in out
    tune_help = cli("tune", "--help").stdout
    assert "--trials" in tune_help and "Ctrl-C" in tune_help and "--shape" in tune_help


def test_targets_lists_gpus_cpus_and_host():
    out = cli("targets").stdout
    for name in ("a100", "mi250x", "x86_avx2", "x86_avx512", "host"):
        assert name in out


def test_plan_writes_json(tmp_path):
    # in NCHW (auto blocks its second conv on this CPU, which adds a layout transform)
    out = cli("plan", "embedded", "--planner", "fuseops", "--layout", "nchw",
              "--json", tmp_path / "f.json").stdout
    assert "fused_conv2d" in out and "7 kernels" in out
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["schema"] == "tvm-fusion/plan" and len(doc["groups"]) == 7
    out = cli("plan", "embedded", "--layout", "nchw",
              "--json", tmp_path / "c.json").stdout  # cost planner
    cost = json.loads((tmp_path / "c.json").read_text())
    # on this CPU the cost plan keeps FuseOps' 7 kernels: softmax and the mean would
    # only save a VM call by joining their GEMM/conv, whose results stay in cache
    assert cost["planner"] == "cost" and len(cost["groups"]) <= 7


def test_plan_says_its_stages_once_it_takes_a_while():
    """``plan`` shows each stage on stderr once planning has taken ``after_s`` (0 here:
    at once); a quick plan, or --quiet, says nothing."""
    import io

    from tvm_fusion.tune.progress import Stages

    out = io.StringIO()
    stages = Stages("plan", after_s=0, stream=out)
    stages("planning 670 ops")
    stages("Q/K/V: planning the graph with all 38 groups of parallel matmuls combined")
    stages.close()
    lines = out.getvalue().splitlines()
    assert [line.split("] ", 1)[-1] for line in lines[:2]] == [
        "planning 670 ops",
        "Q/K/V: planning the graph with all 38 groups of parallel matmuls combined"]
    assert lines[0].startswith("plan: [") and lines[2].startswith("plan: done in")
    for quiet in (Stages("plan", after_s=3600, stream=io.StringIO()),
                  Stages("plan", after_s=0, enabled=False, stream=io.StringIO())):
        quiet("planning 670 ops")
        quiet.close()
        assert quiet.stream.getvalue() == ""


def test_errors_name_the_problem(tmp_path):
    proc = cli("plan", tmp_path / "nope.onnx", check=False)
    assert proc.returncode == 2 and "nope.onnx" in proc.stderr
    model = build_embedded_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(model, path)
    proc = cli("plan", path, check=False)
    assert proc.returncode == 2 and "image" in proc.stderr and "--shape" in proc.stderr
    assert cli("plan", path, "--shape", "image=1,3,32,32").returncode == 0


def _wait_for_trials(manifest: Path, proc, at_least: int, timeout: float = 300) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if manifest.exists():
            try:
                entry = next(iter(json.loads(manifest.read_text())["models"].values()))
            except (json.JSONDecodeError, StopIteration):
                entry = {"trials": 0}
            if entry["trials"] >= at_least:
                return entry["trials"]
        time.sleep(0.2)
    raise AssertionError("tuning made no progress")


TRIALS = 4  # under the embedded model's 7 kernels: one trial a batch, so Ctrl-C lands mid-run


def test_tune_interrupt_resume_compile_run(tmp_path):
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tvm_fusion", "tune", "embedded", "--trials", str(TRIALS),
         "--logs", str(logs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True)  # our own group: the signal reaches only us
    manifest = logs / "host" / "manifest.json"
    _wait_for_trials(manifest, proc, 1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    assert "Ctrl-C" in err and "run the same command again" in out
    done = next(iter(json.loads(manifest.read_text())["models"].values()))["trials"]
    assert 1 <= done < TRIALS
    measured = logs / "host" / "candidates" / "database_tuning_record.json"
    assert len(measured.read_text().splitlines()) >= 1  # measurements survived

    resumed = cli("tune", "embedded", "--trials", TRIALS, "--logs", logs, "--quiet").stdout
    entry = next(iter(json.loads(manifest.read_text())["models"].values()))
    assert entry["trials"] >= TRIALS - 1  # small tasks can exhaust their space early
    assert f"{entry['trials']} in total" in resumed
    assert "cost model: none (MetaSchedule's XGBoost" in resumed  # conftest sets none
    again = cli("tune", "embedded", "--trials", TRIALS, "--logs", logs, "--quiet").stdout
    assert "0 trials this run" in again

    so = tmp_path / "model.so"
    out = cli("compile", "embedded", "--logs", logs, "-o", so).stdout
    info = json.loads(Path(str(so) + ".json").read_text())
    assert len(info["kernels"]) == len(entry["plan"]["groups"])
    assert len(info["untuned"]) < len(info["kernels"])  # records were applied
    assert info["plan_hash"] == entry["plan"]["hash"]  # the tuned plan, re-applied
    onnx_path = tmp_path / "embedded.onnx"
    onnx.save(build_embedded_model(), onnx_path)
    run = cli("run", so, "--compare", onnx_path, "--repeat", "5").stdout
    assert "latency: median" in run and "ok" in run


def test_compile_without_logs_and_run_detects_a_wrong_model(tmp_path):
    so = tmp_path / "plain.so"
    out = cli("compile", "embedded", "--logs", tmp_path / "none", "-o", so,
              "--no-record", "auto").stdout
    assert "rule default" in out and "fused_conv2d" in out and "unscheduled" not in out
    other = tmp_path / "other.onnx"
    onnx.save(build_embedded_model(seed=1), other)  # same signature, other weights
    proc = cli("run", so, "--compare", other, "--repeat", "3", check=False)
    assert proc.returncode == 1 and "FAIL" in proc.stdout
