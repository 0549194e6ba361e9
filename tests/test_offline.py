"""Offline measurement: export a bundle, run it with TVM's runtime alone, import records.

The device here is this machine's CPU; the runner runs in a fresh process with
``TVM_USE_RUNTIME_LIB=1`` (no compiler library loaded), as on a device machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tvm_fusion as tf
from tvm_fusion.embedded import build_embedded_model
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
from tvm_fusion.offline import bundle as offline
from tvm_fusion.offline import runner as offline_runner
from tvm_fusion.logs.dirs import open_database
from tvm_fusion.logs.manifest import read_manifest
from tvm_fusion.offline.runner import Results

RUNNER = Path(offline_runner.__file__)


def _run_device(bundle: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    return subprocess.run([sys.executable, str(RUNNER), str(bundle), "--repeat", "3"],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    model = tf.import_model(build_embedded_model(), name="embedded")
    bundle = offline.export_bundle([model], "host", tmp_path_factory.mktemp("b") / "bundle",
                                   plans=("cost",), candidates=3, progress=lambda s: None)
    # one kernel's CPU reference is spoiled: its default must fail the check on the
    # device, and none of its candidates may become a record
    meta = json.loads((bundle / "bundle.json").read_text())
    spoiled = meta["kernels"][0]
    ref = dict(np.load(bundle / spoiled["ref"]))
    np.savez(bundle / spoiled["ref"], **{k: v + 1.0 for k, v in ref.items()})
    proc = _run_device(bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return model, bundle, meta, spoiled, proc


def test_runner_checks_models_and_kernels_with_the_runtime_only(measured):
    model, bundle, meta, spoiled, proc = measured
    models, kernels = offline.read_results(bundle)
    row = models["embedded.cost"]
    assert row["matches_onnxruntime"] and row["max_rel_error"] < 1e-4
    assert row["median_ms"] > 0
    assert set(kernels) == {k["lib"] for k in meta["kernels"]}
    assert "differs from the CPU reference" in kernels[spoiled["lib"]]["default_error"]
    for k in meta["kernels"]:
        if k is spoiled:
            continue
        row = kernels[k["lib"]]
        assert "default_error" not in row, row
        assert row["default_max_rel_error"] < 1e-4
        assert set(row["candidates"]) == set(k["candidates"])


def test_imported_records_build_a_model_that_matches_onnxruntime(measured, tmp_path):
    model, bundle, meta, spoiled, _ = measured
    summary = offline.import_measurements(bundle, tmp_path / "logs")
    assert summary.records >= 1 and summary.kernels_improved >= 1
    db = open_database(tmp_path / "logs" / "host", create=False)
    with db:
        keys = {db.workload_key(wl) for wl in db.workloads() if db.records_of(wl)}
    assert spoiled["workload"][0] not in keys  # no record from a kernel whose check failed
    timed = open_database(tmp_path / "logs" / "host" / "candidates", create=False)
    verified = sum(c.get("verified", False) for row in offline.read_results(bundle)[1].values()
                   for c in row["candidates"].values() if "default_error" not in row)
    assert len(timed) == verified  # every verified timing, for cost-model training
    manifest = read_manifest(tmp_path / "logs" / "host")
    # the manifest says which bundle measured it (not the name of its last candidate)
    assert {e.extra["offline"]["bundle"] for e in manifest.models.values()} == \
        {Path(bundle).name.split(".tar")[0].removesuffix(".tgz")}
    compiled = tf.compile_model(model, "host", logs=tmp_path / "logs")
    assert len(compiled.untuned) < len(compiled.kernels)
    inputs = random_inputs(model.inputs)
    got = tf.load_module(compiled.export(tmp_path / "m.so"))(*inputs)
    for g, w in zip(got, run_onnxruntime(model.onnx_model, inputs), strict=True):
        assert max_rel_error(np.asarray(g), w) < 1e-4


def test_a_candidate_far_slower_than_the_default_is_neither_checked_nor_timed(
        measured, tmp_path, monkeypatch):
    _, bundle, meta, spoiled, _ = measured
    monkeypatch.setattr(offline_runner, "SLOW_CALL_S", 0.0)  # every call is "too slow"
    monkeypatch.setattr(offline_runner, "SLOW_FACTOR", 0.0)
    results = tmp_path / "results.jsonl"
    assert offline_runner.main([str(bundle), "--only", "kernels", "--results",
                                str(results)]) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    kernels = [r for r in rows if r["kind"] == "kernel" and "default_error" not in r]
    assert len(kernels) == len(meta["kernels"]) - 1  # all but the spoiled one
    for row in kernels:
        for c in row["candidates"].values():
            assert not c["verified"] and "run_secs" not in c
            assert c["error"].startswith("too slow to check and time: one call took")


def test_a_process_that_dies_on_a_candidate_skips_it_when_run_again(tmp_path):
    path = tmp_path / "results.jsonl"
    lines = [{"kind": "start"}, {"kind": "inflight", "lib": "k0.so", "name": "c0"},
             {"kind": "inflight", "lib": "k0.so", "name": "c1"},
             {"kind": "kernel", "lib": "k0.so"},
             {"kind": "inflight", "lib": "k1.so", "name": "c0"},
             {"kind": "inflight", "lib": "k1.so", "name": "c1"},  # died here
             {"kind": "start"}, {"kind": "inflight", "lib": "k1.so", "name": "c0"},
             {"kind": "inflight", "lib": "k1.so", "name": "c2"}]  # and here
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "ker')
    r = Results(path)
    assert r.done == {"k0.so"}
    assert r.crashed == {"k1.so": {"c1", "c2"}}


def test_the_runners_error_measure_is_the_one_tune_and_run_use():

    rng = np.random.default_rng(0)
    want = rng.standard_normal((4, 5)).astype("float32")
    cases = [want + 1e-5, want, np.full_like(want, np.inf), want.astype("float64")]
    for got in cases:
        assert offline_runner.max_rel_error(got, want) == max_rel_error(got, want)


def test_results_lines_the_runner_never_writes_are_skipped_with_a_warning(tmp_path):
    """A results.jsonl edited by hand or cut by a dying device: rows without their key
    (a model's label, a kernel's lib), non-objects and bytes that are not UTF-8 are
    skipped and counted, never a KeyError (exit 70) that loses the good rows."""
    good_model = {"kind": "model", "label": "m cost", "ms": 1.0}
    good_kernel = {"kind": "kernel", "lib": "kernels/k000.so", "default_us": 3.0}
    lines = [json.dumps(good_model).encode(), json.dumps({"kind": "model"}).encode(),
             json.dumps({"kind": "kernel", "lib": ["x"]}).encode(), b"[1, 2]",
             b'{"kind": "kernel", "lib": "\xff\xfe"', json.dumps(good_kernel).encode(),
             b'{"kind": "kern']
    (tmp_path / "results.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.warns(UserWarning, match=r"skipped 5 line\(s\).*line 2, 3, 4, 5, 7"):
        models, kernels = offline.read_results(tmp_path)
    assert models == {"m cost": good_model} and kernels == {"kernels/k000.so": good_kernel}
    # the runner resuming from the same file skips them too
    done = Results(tmp_path / "results.jsonl").done
    assert done == {"m cost", "kernels/k000.so"}


def test_a_candidate_that_hangs_on_the_device_is_timed_out_and_the_runner_resumes(tmp_path):
    """A kernel library whose candidate ``c0`` never returns (a loop on an input value)
    between two good ones: the runner (its own process, as on a device) records ``c0``
    as timed out after --kernel-timeout, restarts itself, and checks and times ``c1``."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def default(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i] + T.float32(1)

    @T.prim_func
    def hang(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        while a[0] > T.float32(-1e30):  # random inputs are finite: forever
            b[0] = b[0] + T.float32(1)

    bundle = tmp_path / "bundle"
    (bundle / "kernels").mkdir(parents=True)
    lib = tvm.tirx.build(tvm.IRModule({
        n: f.with_attr("global_symbol", n)
        for n, f in (("default", default), ("c0", hang), ("c1", default))}), target="llvm")
    lib.export_library(str(bundle / "kernels" / "k0.so"))
    params = [[[4], "float32"], [[4], "float32"]]
    a, b = offline_runner.buffers(params, 0)
    np.savez(bundle / "kernels" / "k0.ref.npz", b1=a + 1)
    (bundle / "bundle.json").write_text(json.dumps({"device": "cpu", "models": [], "kernels": [
        {"task": "add_one", "lib": "kernels/k0.so", "ref": "kernels/k0.ref.npz",
         "params": params, "checksum": float(a.sum() + b.sum(), ),
         "candidates": ["c0", "c1"]}]}))
    proc = subprocess.run([sys.executable, str(RUNNER), str(bundle), "--kernel-timeout", "1"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TVM_USE_RUNTIME_LIB": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "c0 still running after 1 s (--kernel-timeout)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    rows = [json.loads(line) for line in (bundle / "results.jsonl").read_text().splitlines()]
    (kernel,) = [r for r in rows if r["kind"] == "kernel"]
    assert kernel["candidates"]["c0"]["timed_out"] is True
    assert "still running after 1.0 s" in kernel["candidates"]["c0"]["error"]
    assert kernel["candidates"]["c1"]["verified"] and kernel["candidates"]["c1"]["median_us"] > 0
