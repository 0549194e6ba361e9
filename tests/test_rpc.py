"""Measurement through a real TVM RPC tracker and server on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.logs.dirs import open_database, target_dir
from tvm_fusion.tune.measure import MeasureError, check_tracker, make_runner, parse_tracker

pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args, log):
    # own session: the RPC server forks a worker that must go down with it
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def rpc(tmp_path_factory):
    """A tracker and one ``cpu0`` server on loopback; yields (tracker, server log path)."""
    logs = tmp_path_factory.mktemp("rpc")
    port = _free_port()
    procs = []
    with open(logs / "tracker.log", "w") as tlog, open(logs / "server.log", "w") as slog:
        procs.append(_start(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port",
                             str(port), "--port-end", str(port + 1)], tlog))
        sport = _free_port()
        procs.append(_start(["tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}",
                             "--key", "cpu0", "--host", "127.0.0.1", "--port", str(sport),
                             "--port-end", str(sport + 1)], slog))
        try:
            deadline = time.monotonic() + 90
            while True:  # both start by importing TVM: seconds on a loaded machine
                try:
                    check_tracker("127.0.0.1", port, "cpu0", timeout_s=2)
                    break
                except MeasureError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            yield f"127.0.0.1:{port}", logs / "server.log"
        finally:
            for p in reversed(procs):
                _stop(p)


def _matmul_relu_model():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [64, 256])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_tune_measures_through_the_tracker(rpc, tmp_path):
    tracker, server_log = rpc
    model = tf.import_model(_matmul_relu_model(), name="mm-relu")
    report = tf.tune(model, "host", trials=4, logs=tmp_path, progress=False,
                     search_options=tf.SearchOptions(
                         rpc=tf.RpcOptions(tracker=tracker, key="cpu0")))
    assert report.trials_run == 4
    # every candidate the runner measured was loaded by the RPC server
    loads = server_log.read_text().count("load_module")
    cands = open_database(target_dir(tmp_path, "host") / "candidates", create=False)
    measured = [r for r in cands.get_all_tuning_records() if len(r.run_secs) > 1]
    assert loads >= len(measured) >= 1
    # the best candidate passed verification and went to the deployable database
    accepted = open_database(target_dir(tmp_path, "host"), create=False)
    records = accepted.get_all_tuning_records()
    assert len(records) >= 1 and all(len(r.run_secs) >= 5 for r in records)
    assert report.est_ms is not None
    # verification ran on the remote device too (the path a GPU with no local twin takes):
    # the reference and every checked candidate were uploaded there as kernel.so
    verified = [line for line in server_log.read_text().splitlines()
                if "load_module" in line and line.rstrip().endswith("kernel.so")]
    assert len(verified) >= 1 + len(records), server_log.read_text()[-2000:]


def test_tracker_errors_name_the_problem(rpc):
    tracker, _ = rpc
    host, port = parse_tracker(tracker)
    with pytest.raises(MeasureError, match="no RPC server with key 'gpu9'.*keys there: "
                                           r"\['cpu0'\]"):
        check_tracker(host, port, "gpu9")
    with pytest.raises(MeasureError, match="cannot reach the RPC tracker"):
        make_runner(rpc_tracker=f"127.0.0.1:{_free_port()}", rpc_key="cpu0")
    with pytest.raises(MeasureError, match="HOST:PORT"):
        make_runner(rpc_tracker="localhost", rpc_key="cpu0")
    with pytest.raises(MeasureError, match="go together"):
        make_runner(rpc_tracker=tracker)


def test_cli_refuses_an_unreachable_tracker_before_tuning(tmp_path, capsys):
    from tvm_fusion.cli import main

    rc = main(["tune", "embedded", "--trials", "4", "--logs", str(tmp_path), "--quiet",
               "--rpc-tracker", f"127.0.0.1:{_free_port()}", "--rpc-key", "cpu0"])
    assert rc == 2
    assert "cannot reach the RPC tracker" in capsys.readouterr().err
    assert not (tmp_path / "host" / "candidates").exists()  # nothing was tuned


def test_each_measurement_has_repeats_and_near_ties_are_timed_again():
    """The runner gives REPEAT timings (median and spread); remeasure interleaves more."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion.compat.fast_import import build_kernel
    from tvm_fusion.tune.measure import REPEAT, device_type, median_us, remeasure, spread_pct

    assert median_us([3e-6, 1e-6, 2e-6]) == pytest.approx(2.0)
    assert spread_pct([1e-6, 1.5e-6, 2e-6]) == pytest.approx(66.666, rel=1e-3)
    x = te.placeholder((1024,), name="x")
    y = te.compute((1024,), lambda i: x[i] * 2.0, name="y")
    mod = tvm.IRModule({"main": te.create_prim_func([x, y]).with_attr("global_symbol", "main")})
    target = tf.load_target("host").tvm_target()
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export

    artifact = default_export(build_kernel(mod, target, None))  # as the builder does
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    runner = make_runner()
    dev = device_type(target)
    first = runner.run([ms.runner.RunnerInput(artifact, dev, args)])[0].result()
    assert first.error_msg is None and len(first.run_secs) == REPEAT
    again = remeasure(runner, dev, [(artifact, args), (artifact, args)], rounds=2)
    assert [len(a) for a in again] == [2 * REPEAT, 2 * REPEAT]
    assert all(s > 0 for a in again for s in a)
