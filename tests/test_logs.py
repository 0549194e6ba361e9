"""Tuning logs that survive anything, deployment from them, the logs tools and the JIT.

The robustness cases run for real: tuners are separate processes, one is killed with
SIGKILL mid-tune and resumed while a second tuner shares the directory; a torn last line
is left in the database as a crash mid-write would leave it. Budgets are tiny (a one-
kernel model, 4-8 trials) so the module tunes once, in about two minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te
from tvm.s_tir import meta_schedule as ms

import tvm_fusion as tf
from tvm_fusion.errors import LogError
from tvm_fusion.reference import max_rel_error, run_onnxruntime
from tvm_fusion.logs.logdb import (RECORD_FILE, WORKLOAD_FILE, CorruptLogWarning, DirLock,
                                   LogDatabase, is_measured, read_run_times, write_database)
from tvm_fusion.logs.manifest import (Manifest, read_manifest, target_identity,
                                      write_manifest)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def tiny_onnx(path: Path) -> Path:
    """MatMul + bias + ReLU with a dynamic batch: one fused kernel, any batch size."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype("float32"), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["out"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 32])],
        initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


TUNER = textwrap.dedent("""
    import sys
    import tvm_fusion as tf
    onnx_path, logs, batch, trials = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    model = tf.import_model(onnx_path, {"x": (batch, 64)})
    r = tf.tune(model, "host", trials=trials, logs=logs, progress=False,
                search_options=tf.SearchOptions(trials_per_batch=4))
    print("TOTAL", r.trials_total)
""")


def tuner(onnx_path, logs, batch, trials) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", TUNER, str(onnx_path), str(logs), str(batch), str(trials)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        start_new_session=True)  # its own group: we clean up its workers after a kill


def entry_of(tdir: Path, batch: int) -> dict | None:
    m = json.loads((tdir / "manifest.json").read_text())
    return next((e for e in m["models"].values() if e["inputs"]["x"][0] == batch), None)


def run_py(code: str, *args, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, env=ENV, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


class CliRun:
    """``tvm-fusion ARGS`` run in this process (a TVM import per call would cost ~6 s)."""

    def __init__(self, capsys):
        self.capsys = capsys

    def __call__(self, *args, check=True) -> subprocess.CompletedProcess:
        from tvm_fusion.cli import main

        self.capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rc = main([str(a) for a in args])
        out, err = self.capsys.readouterr()
        if check:
            assert rc == 0, out + err
        return subprocess.CompletedProcess(args, rc, out, err)


@pytest.fixture
def cli(capsys):
    return CliRun(capsys)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """Tune, SIGKILL mid-tune, tear the last line, then resume alongside a second tuner."""
    base = tmp_path_factory.mktemp("logs")
    onnx_path = tiny_onnx(base / "tiny.onnx")
    logs = base / "logs"
    tdir = logs / "host"
    proc = tuner(onnx_path, logs, 64, 8)
    end = time.monotonic() + 400
    killed_at = None
    while time.monotonic() < end and proc.poll() is None:
        entry = entry_of(tdir, 64) if (tdir / "manifest.json").exists() else None
        if entry and 4 <= entry["trials"] < 8:  # a batch is saved, the next in flight
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_at = entry["trials"]
            break
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # builder/runner workers it left behind
    except ProcessLookupError:
        pass
    out, err = proc.communicate(timeout=60)
    assert killed_at is not None, f"the tuner ended before it could be killed: {out}{err}"
    after_kill = {"trials": entry_of(tdir, 64)["trials"],
                  "candidates": LogDatabase(tdir / "candidates").record_lines,
                  "records": len(LogDatabase(tdir))}
    # A crash in the middle of a write: the last line of the deployable database torn.
    rec_file = tdir / RECORD_FILE
    last = rec_file.read_bytes().splitlines()[-1]
    with open(rec_file, "ab") as f:
        f.write(last[: len(last) // 2])
    resumed, second = tuner(onnx_path, logs, 64, 8), tuner(onnx_path, logs, 32, 4)
    outs = [p.communicate(timeout=600) for p in (resumed, second)]
    for p, (o, e) in zip((resumed, second), outs):
        assert p.returncode == 0, o + e
    return {"onnx": onnx_path, "logs": logs, "tdir": tdir, "killed_at": killed_at,
            "after_kill": after_kill, "outs": outs}


def copy_logs(scenario, dest: Path) -> Path:
    shutil.copytree(scenario["logs"], dest)
    return dest


# ---- the database alone: no tuning ----------------------------------------------------

def _workload(n: int) -> tvm.IRModule:
    x = te.placeholder((n, 64), "float32", name="x")
    y = te.compute((n, 64), lambda i, j: te.sigmoid(x[i, j]), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y]).with_attr("global_symbol", "main")})


def _record(wl, mod, split: int, secs: float):
    sch = tvm.s_tir.Schedule(mod)
    _, j = sch.get_loops(sch.get_sblock("y"))
    _, ji = sch.split(j, [None, split])
    sch.vectorize(ji)
    return ms.database.TuningRecord(sch.trace, wl, [secs], tvm.target.Target({"kind": "llvm"}),
                                    ms.arg_info.ArgInfo.from_prim_func(mod["main"]))


def test_garbage_and_truncated_lines_are_skipped_with_one_warning(tmp_path):
    db = LogDatabase(tmp_path, writable=True)
    for n in (8, 16):
        mod = _workload(n)
        wl = db.commit_workload(mod)
        for split in (4, 8):
            db.commit_tuning_record(_record(wl, mod, split, split * 1e-6))
    assert len(ms.database.JSONDatabase(str(tmp_path / WORKLOAD_FILE),
                                        str(tmp_path / RECORD_FILE))) == 4  # stock reads it
    good = (tmp_path / RECORD_FILE).read_bytes().splitlines()
    with open(tmp_path / RECORD_FILE, "ab") as f:
        f.write(b"garbage\n" + b"[7, []]\n" + good[0][:-5] + b"\n" + good[1][:40])
    with pytest.raises(Exception):  # stock TVM cannot read past the first bad line
        ms.database.JSONDatabase(str(tmp_path / WORKLOAD_FILE), str(tmp_path / RECORD_FILE))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = LogDatabase(tmp_path, writable=True)
    assert len(caught) == 1 and issubclass(caught[0].category, CorruptLogWarning)
    assert "skipped 4 unreadable line(s)" in str(caught[0].message)
    best = db.records_of(db.commit_workload(_workload(8)))[0]
    assert len(db) == 4 and float(best.run_secs[0]) == pytest.approx(4e-6)
    # A writer closes the torn last line as it opens (no writer is mid-line under its
    # lock), so it stays one bad line even if this writer never appends.
    assert (tmp_path / RECORD_FILE).read_bytes().endswith(good[1][:40] + b"\n")
    assert db.bad_lines[-1].reason.startswith("not JSON")
    # The next append does not glue onto it either.
    mod = _workload(8)
    db.commit_tuning_record(_record(db.commit_workload(mod), mod, 16, 1e-6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = LogDatabase(tmp_path)
    assert len(again) == 5 and len(again.bad_lines) == 4 and len(caught) == 1
    best = again.records_of(again.commit_workload(mod))[0]
    assert float(best.run_secs[0]) == pytest.approx(1e-6)
    with pytest.raises(LogError, match="read-only"):
        again.commit_workload(_workload(24))


def test_a_broken_workload_line_keeps_the_numbering_of_the_others(tmp_path):
    db = LogDatabase(tmp_path, writable=True)
    for n in (8, 16, 24):
        mod = _workload(n)
        db.commit_tuning_record(_record(db.commit_workload(mod), mod, 4, n * 1e-6))
    lines = (tmp_path / WORKLOAD_FILE).read_text().splitlines()
    lines[0] = lines[0][: len(lines[0]) // 3]  # the first workload's module cut short
    (tmp_path / WORKLOAD_FILE).write_text("\n".join(lines) + "\n")
    with pytest.warns(CorruptLogWarning, match="skipped 2 unreadable"):
        db = LogDatabase(tmp_path)
    assert [b.file for b in db.bad_lines] == [WORKLOAD_FILE, RECORD_FILE]
    assert "refers to workload line 1" in db.bad_lines[1].reason
    for rec in db.get_all_tuning_records():  # 16 and 24 still under their own workload
        assert round(float(rec.run_secs[0]) * 1e6) == int(rec.workload.mod["main"].params[0].shape[0])
    assert len(db) == 2


def test_the_tools_reader_keeps_the_numbering_too_and_skips_failed_runs(tmp_path):
    # read_run_times is what curves, the cost-model dataset and benchmarks read with:
    # the same files, no trace replayed, the same workload numbering as LogDatabase's.
    db = LogDatabase(tmp_path, writable=True)
    for n in (8, 16, 24):
        mod = _workload(n)
        db.commit_tuning_record(_record(db.commit_workload(mod), mod, 4, n * 1e-6))
    mod = _workload(8)
    db.commit_tuning_record(_record(db.commit_workload(mod), mod, 4, 1e10))  # failed run
    lines = (tmp_path / WORKLOAD_FILE).read_text().splitlines()
    lines[0] = lines[0][: len(lines[0]) // 3]
    (tmp_path / WORKLOAD_FILE).write_text("\n".join(lines) + "\n")
    with open(tmp_path / RECORD_FILE, "a") as f:
        f.write('{"not": "a record"}\n[1, {"no": "run_secs"}]\n')
    hashes, records = read_run_times(tmp_path)
    assert hashes[0] is None and all(hashes[1:3])
    assert [(idx, round(secs[0] * 1e6)) for idx, secs in records if is_measured(secs)] == [
        (0, 8), (1, 16), (2, 24)]
    assert [idx for idx, secs in records if not is_measured(secs)] == [0]


def test_a_writer_survives_the_files_being_rewritten_under_it(tmp_path):
    """`logs prune` renumbers workloads while a tuner has the database open."""
    db = LogDatabase(tmp_path, writable=True)
    mods = {n: _workload(n) for n in (8, 16, 24)}
    for n, mod in mods.items():
        db.commit_tuning_record(_record(db.commit_workload(mod), mod, 4, n * 1e-6))
    other = LogDatabase(tmp_path)
    keep = [w for w in other.workloads() if int(w.mod["main"].params[0].shape[0]) == 24]
    with DirLock(tmp_path, exclusive=True):  # what prune does: 24 becomes workload line 1
        write_database(tmp_path, [(keep[0], other.records_of(keep[0]))])
    db.commit_tuning_record(_record(db.commit_workload(mods[24]), mods[24], 8, 24e-6))
    db.commit_tuning_record(_record(db.commit_workload(mods[8]), mods[8], 8, 8e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = LogDatabase(tmp_path)
    assert len(again) == 3
    for rec in again.get_all_tuning_records():
        assert round(float(rec.run_secs[0]) * 1e6) == int(rec.workload.mod["main"].params[0].shape[0])


WRITER = textwrap.dedent("""
    import glob, sys, time
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    from tvm_fusion.logs.logdb import LogDatabase
    path, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    def workload(n):
        x = te.placeholder((n, 64), "float32", name="x")
        y = te.compute((n, 64), lambda i, j: te.sigmoid(x[i, j]), name="y")
        return tvm.IRModule({"main": te.create_prim_func([x, y]).with_attr("global_symbol", "main")})
    db = LogDatabase(path, writable=True)
    target = tvm.target.Target({"kind": "llvm"})
    open(f"{path}/ready-{sizes[0]}", "w").close()  # both opened the database: now go
    while len(glob.glob(f"{path}/ready-*")) < 2:
        time.sleep(0.01)
    for i in range(8):
        for n in sizes:
            time.sleep(0.01)  # interleave the two writers
            mod = workload(n)
            wl = db.commit_workload(mod)
            sch = tvm.s_tir.Schedule(mod)
            sch.parallel(sch.get_loops(sch.get_sblock("y"))[0])
            # the run time names the workload, so a record filed under another shows
            db.commit_tuning_record(ms.database.TuningRecord(
                sch.trace, wl, [n * 1e-6], target, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
""")


def test_two_writer_processes_keep_workload_indices_right(tmp_path):
    """Stock JSONDatabase numbers workloads by what one process saw: two processes
    committing new workloads to one directory file records under the wrong workload."""
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), sizes],
                              env=ENV, stderr=subprocess.PIPE, text=True)
             for sizes in ("8,16,24", "32,16,40")]
    for p in procs:
        err = p.communicate(timeout=300)[1]
        assert p.returncode == 0, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one bad line
        db = LogDatabase(tmp_path)
    assert len(db) == 2 * 8 * 3
    def rows(wl) -> int:
        func = wl.mod["main"]
        return int(func.params[0].shape[0])  # params are Buffers in TVM 0.27

    assert sorted(rows(wl) for wl in db.workloads()) == [8, 16, 24, 32, 40]
    for rec in db.get_all_tuning_records():
        assert round(float(rec.run_secs[0]) * 1e6) == rows(rec.workload)
    stock = ms.database.JSONDatabase(str(tmp_path / WORKLOAD_FILE), str(tmp_path / RECORD_FILE))
    assert len(stock) == len(db)


def test_the_typed_manifest_keeps_every_field_of_the_shipped_logs():
    # old log directories must load, and a rewrite must not drop what a later or an
    # earlier version stored (offline bundles, predicted picks, no-gain kernels)
    from tvm_fusion.data import shipped_logs_dir

    files = sorted(shipped_logs_dir().glob("*/manifest.json"))
    assert files
    for f in files:
        stored = json.loads(f.read_text())
        m = Manifest.from_json(stored)
        assert m.to_json() == stored, f
        for h, e in m.models.items():
            assert e.plan_hash == stored["models"][h]["plan"]["hash"]
            assert e.fusion_plan().hash == e.plan_hash
    entry = {"source": "m.onnx", "trials": 3, "plan": {"hash": "p"}, "inputs": {"x": [1, 2]},
             "predicted": {"k": {"measured": False}}, "predicted_no_gain": {"j": 1},
             "offline": {"bundle": "b"}}
    m = Manifest.from_json({**Manifest.fresh().to_json(), "models": {"h": entry}, "new": 1})
    assert m.to_json()["models"]["h"] == entry and m.to_json()["new"] == 1
    assert m.entry("h").unmeasured == {"k"} and m.entry("h").label("h" * 9) == (
        "m.onnx[x=1x2]#hhhhhhhh")
    with pytest.raises(LogError, match="not a JSON object"):
        Manifest.from_json({"models": {"h": [1]}})


def test_manifest_of_another_version_or_target_is_refused(tmp_path):
    host = tf.load_target("host")
    m = Manifest.fresh().to_json()
    m["target"] = target_identity(host)
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path, expect=host).target["key"] == m["target"]["key"]
    for field, value, match in (("tvm", "0.19.0", "TVM '0.19.0'.*re-tune"),
                                ("version", 99, "version 99")):
        write_manifest(tmp_path, {**m, field: value})
        with pytest.raises(LogError, match=match):
            read_manifest(tmp_path, expect=host, allow_other_target=True)
    other = {**m, "target": {**m["target"], "hardware_hash": "0" * 64,
                             "key": json.dumps({**json.loads(m["target"]["key"]),
                                                "mcpu": "skylake-avx512"})}}
    write_manifest(tmp_path, other)
    with pytest.raises(LogError, match="mcpu: logs 'skylake-avx512'.*--allow-other-target"):
        read_manifest(tmp_path, expect=host)
    assert read_manifest(tmp_path, expect=host, allow_other_target=True)
    (tmp_path / "manifest.json").write_text('{"schema": "tvm-fusion/lo')  # edited by hand
    with pytest.raises(LogError, match="not valid JSON"):
        read_manifest(tmp_path, expect=host)


# ---- real tuning: kill, resume, share ---------------------------------------------------

def test_sigkill_mid_tune_then_resume(scenario):
    tdir, killed = scenario["tdir"], scenario["after_kill"]
    assert 4 <= scenario["killed_at"] < 8
    # Right after the kill everything measured before it loaded, nothing was lost but
    # the batch in flight.
    assert killed["candidates"] >= killed["trials"] >= 4 and killed["records"] >= 1
    entry = entry_of(tdir, 64)
    assert entry["trials"] >= 8 - 1  # resumed to the budget (a space can run dry early)
    assert f"TOTAL {entry['trials']}" in scenario["outs"][0][0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = LogDatabase(tdir)
    assert len(caught) == 1 and "skipped 1 unreadable line(s)" in str(caught[0].message)
    assert db.bad_lines[0].reason.startswith("not JSON")  # torn, then closed by a newline
    assert len(db) >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cands = LogDatabase(tdir / "candidates")
    # at most the line being written when the kill came is lost
    assert cands.record_lines >= entry["trials"] and len(cands.bad_lines) <= 1


def test_two_concurrent_tuners_share_one_directory(scenario):
    tdir = scenario["tdir"]
    big, small = entry_of(tdir, 64), entry_of(tdir, 32)
    assert small is not None and small["trials"] >= 4 - 1 and big["trials"] >= 8 - 1
    keys = {e["kernels"]["fused_matmul_add_relu"]["workload"] for e in (big, small)}
    assert len(keys) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torn line of the scenario
        db = LogDatabase(tdir)
    cands = LogDatabase(tdir / "candidates")
    assert {db.workload_key(w) for w in db.workloads()} == keys
    measured = {cands.workload_key(w): len(cands.records_of(w)) for w in cands.workloads()}
    assert set(measured) == keys and all(n >= 3 for n in measured.values())
    best = {db.workload_key(w): db.records_of(w) for w in db.workloads()}
    assert best[big["kernels"]["fused_matmul_add_relu"]["workload"]]  # verified records


def test_stock_tvm_applies_our_database(scenario, tmp_path, cli):
    logs = copy_logs(scenario, tmp_path / "logs")
    tdir = logs / "host"
    cand = tdir / "candidates"  # never torn: stock-readable as written
    assert len(ms.database.JSONDatabase(str(cand / WORKLOAD_FILE), str(cand / RECORD_FILE))) \
        == LogDatabase(cand).record_lines
    cli("logs", "prune", logs)  # drops the torn line
    stock = ms.database.JSONDatabase(str(tdir / WORKLOAD_FILE), str(tdir / RECORD_FILE))
    model = tf.import_model(scenario["onnx"], {"x": (64, 64)})
    entry = entry_of(tdir, 64)
    graph = tf.build_graph(model.mod)
    mod = tf.apply_plan(graph, tf.FusionPlan.from_json(entry["plan"]))
    assert entry["prepack"] is True  # a CPU target: the weights were tuned layout-free
    with tf.load_target("host").tvm_target(), tvm.transform.PassContext(opt_level=3):
        # marked as TVM's own static_shape_tuning(cpu_weight_prepack=True) marks them
        mod = tvm.relax.transform.AttachAttrLayoutFreeBuffers()(mod)
        with stock:
            mod = tvm.relax.transform.MetaScheduleApplyDatabase()(mod)
    scheduled = [gv.name_hint for gv, f in mod.functions.items()
                 if isinstance(f, tvm.tirx.PrimFunc) and f.attrs
                 and f.attrs.get("tirx.is_scheduled", False)]
    # that pass renames the kernels it marks (fused_matmul_add_relu1)
    assert [n.rstrip("0123456789") for n in scheduled] == ["fused_matmul_add_relu"]


TRIPWIRES = """
    import importlib, sys
    from tvm.s_tir import meta_schedule as ms
    driver = importlib.import_module("tvm_fusion.tune.driver")  # tvm_fusion.tune is a function
    def tripwire(*a, **k):
        raise SystemExit("TUNING RAN")
    ms.tune_tasks = driver._run_search = tripwire
    ms.builder.LocalBuilder.build = ms.runner.LocalRunner.run = tripwire
    importlib.import_module("tvm_fusion.tune.builder").PooledBuilder.build = tripwire
    from tvm_fusion.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def test_model_compiled_from_logs_runs_in_a_fresh_process_without_tuning(scenario, tmp_path):
    logs = scenario["logs"]
    before = snapshot(logs)
    so = tmp_path / "tiny.so"
    proc = run_py(TRIPWIRES, "compile", scenario["onnx"], "--shape", "x=64,64", "--logs",
                  logs, "-o", so)
    assert "TUNING RAN" not in proc.stderr and "skipped 1 unreadable line" in proc.stderr
    info = json.loads(Path(str(so) + ".json").read_text())
    assert info["kernels"] == ["fused_matmul_add_relu"] and info["untuned"] == []
    assert info["plan_hash"] == entry_of(scenario["tdir"], 64)["plan"]["hash"]
    assert snapshot(logs) == before  # nothing measured, nothing written
    out = run_py("""
        import sys, numpy as np, onnx
        import tvm_fusion as tf
        from tvm_fusion.reference import max_rel_error, run_onnxruntime
        m = tf.load_module(sys.argv[1])
        x = np.random.default_rng(1).standard_normal((64, 64)).astype("float32")
        got = m(x)[0]
        want = run_onnxruntime(onnx.load(sys.argv[2]), [x])[0]
        print("ERR", max_rel_error(got, want))
    """, so, scenario["onnx"]).stdout
    assert float(out.split("ERR")[1]) <= 1e-4


def test_other_target_or_tvm_version_is_refused_by_compile(scenario, tmp_path, cli):
    logs = copy_logs(scenario, tmp_path / "logs")
    manifest = logs / "host" / "manifest.json"
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "target": {**m["target"], "hardware_hash": "f" * 64}}))
    so = tmp_path / "m.so"
    args = ("compile", scenario["onnx"], "--shape", "x=64,64", "--logs", logs, "-o", so)
    proc = cli(*args, check=False)
    assert proc.returncode == 2 and "--allow-other-target" in proc.stderr
    assert "hardware hash: logs ffffffffffff" in proc.stderr
    assert "no tuning record" not in cli(*args, "--allow-other-target").stdout  # applied
    manifest.write_text(json.dumps({**m, "tvm": "0.18.0"}))
    proc = cli(*args, "--allow-other-target", check=False)
    assert proc.returncode == 2 and "TVM '0.18.0'" in proc.stderr and "re-tune" in proc.stderr
    proc = cli("logs", "validate", logs, check=False)
    assert proc.returncode == 1 and "TVM '0.18.0'" in proc.stdout


def _mean_s(record) -> float:
    secs = [float(t) for t in record.run_secs]
    return sum(secs) / len(secs)


def test_logs_show_validate_prune_merge(scenario, tmp_path, cli):
    logs = copy_logs(scenario, tmp_path / "logs")
    shown = json.loads(cli("logs", "show", logs, "--json").stdout)[0]
    assert shown["target"]["name"] == "host" and len(shown["models"]) == 2
    assert len(shown["workloads"]) == 2 and len(shown["skipped_lines"]) == 1
    users = {u["model"].split("[")[1].split("]")[0]
             for w in shown["workloads"] for u in w["used_by"]}
    assert users == {"x=64x64", "x=32x64"}
    text = cli("logs", "show", logs).stdout
    assert "fused_matmul_add_relu x1 (tiny.onnx[x=64x64]" in text

    proc = cli("logs", "validate", logs, check=False)  # the torn line is a broken record
    assert proc.returncode == 1 and "line" in proc.stdout and "broken" in proc.stdout

    # A workload no model uses any more: prune drops it, with the torn line and all
    # records but the best.
    tdir = logs / "host"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = LogDatabase(tdir, writable=True)
    mod = _workload(8)
    db.commit_tuning_record(_record(db.commit_workload(mod), mod, 4, 1e-6))
    cli("logs", "prune", logs)
    pruned = LogDatabase(tdir)
    assert not pruned.bad_lines and len(pruned.workloads()) == 2
    assert all(len(pruned.records_of(w)) <= 1 for w in pruned.workloads())
    assert "of 2 workloads replayed: ok" in cli("logs", "validate", logs, "--build").stdout

    # Merge: the best record per workload from two directories, refusing another target.
    other = tmp_path / "other"
    shutil.copytree(scenario["logs"], other)
    merged = tmp_path / "merged"
    cli("logs", "merge", logs, other, "-o", merged)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = LogDatabase(other / "host")
    out = LogDatabase(merged / "host")
    assert len(out.workloads()) == 2
    for w in out.workloads():
        key = out.workload_key(w)
        # Records carry several repeats; best means least mean time, as MetaSchedule ranks.
        want = min([_mean_s(r) for s in (src, pruned) for v in s.workloads()
                    if s.workload_key(v) == key for r in s.records_of(v)], default=None)
        got = [_mean_s(r) for r in out.records_of(w)]
        assert got == ([] if want is None else [pytest.approx(want)])
    assert len(json.loads((merged / "host" / "manifest.json").read_text())["models"]) == 2
    m = json.loads((other / "host" / "manifest.json").read_text())
    m["target"]["hardware_hash"] = "e" * 64
    (other / "host" / "manifest.json").write_text(json.dumps(m))
    proc = cli("logs", "merge", logs, other, "-o", tmp_path / "nope", check=False)
    assert proc.returncode == 2 and "refusing to merge records of different targets" in proc.stderr
    assert not (tmp_path / "nope").exists()


# ---- JIT --------------------------------------------------------------------------------

def test_jit_compiles_per_shape_caches_on_disk_and_reuses_across_processes(scenario, tmp_path, cli):
    logs = copy_logs(scenario, tmp_path / "logs")
    cli("logs", "prune", logs)  # no torn line: this test is about the JIT
    cache = tmp_path / "cache"
    fn = tf.jit(scenario["onnx"], target="host", logs=logs, cache_dir=cache)
    proto = onnx.load(scenario["onnx"])
    rng = np.random.default_rng(2)
    x64 = rng.standard_normal((64, 64)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tuned shape: no warning
        got = fn(x64)[0]
    assert max_rel_error(got, run_onnxruntime(proto, [x64])[0]) <= 1e-4
    assert [(e.kind, e.untuned) for e in fn.events] == [("compiled", ())]

    x16 = rng.standard_normal((16, 64)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(x16)
        got = fn(x=x16)[0]
    assert len(caught) == 1 and issubclass(caught[0].category, tf.deploy.UntunedShapeWarning)
    assert "x=16x64" in str(caught[0].message) and "--shape x=16,64" in str(caught[0].message)
    assert max_rel_error(got, run_onnxruntime(proto, [x16])[0]) <= 1e-4
    assert [e.kind for e in fn.events] == ["compiled", "compiled"]
    info = json.loads(Path(str(fn.events[1].path) + ".json").read_text())
    assert info["untuned"] == ["fused_matmul_add_relu"]  # listed with its predicted share
    assert info["untuned_est_share"] == {"fused_matmul_add_relu": pytest.approx(1.0)}
    assert len(list(cache.glob("*.so"))) == 2

    out = run_py("""
        import sys, numpy as np, tvm_fusion as tf
        fn = tf.jit(sys.argv[1], target="host", logs=sys.argv[2], cache_dir=sys.argv[3])
        x = np.random.default_rng(2).standard_normal((64, 64)).astype("float32")
        y = fn(x)[0]
        print("EVENTS", [e.kind for e in fn.events], float(np.abs(y).sum()))
    """, scenario["onnx"], logs, cache).stdout
    assert "EVENTS ['cache']" in out
    assert float(out.split("]")[-1]) == pytest.approx(float(np.abs(fn(x64)[0]).sum()), rel=1e-6)

    # New log content is a new key: nothing stale is reused.
    key = fn.cache_key([("x", (64, 64))])
    m = json.loads((logs / "host" / "manifest.json").read_text())
    (logs / "host" / "manifest.json").write_text(json.dumps({**m, "note": "edited"}))
    assert fn.cache_key([("x", (64, 64))]) != key


def test_merge_takes_logs_keyed_by_the_old_all_values_hash_as_the_same_target(tmp_path):
    from tvm_fusion.logs.tools import merge

    host = tf.load_target("host")
    for sub, h in (("old", host.values_hash), ("new", host.hardware_hash),
                   ("other", "0" * 64)):
        m = Manifest.fresh().to_json()
        m["target"] = {**target_identity(host), "hardware_hash": h}
        (tmp_path / sub / "host").mkdir(parents=True)
        write_manifest(tmp_path / sub / "host", m)
    (report,) = merge([tmp_path / "old", tmp_path / "new"], tmp_path / "out")
    assert report["target"] == "host" and len(report["sources"]) == 2
    with pytest.raises(LogError, match="refusing to merge records of different targets"):
        merge([tmp_path / "old", tmp_path / "other"], tmp_path / "out2")
