"""``tvm-fusion demo``: the whole pipeline on the embedded model, in one table."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from . import build_graph, compile_model, import_model, load_module, plan_fusion, tune
from .embedded import build_embedded_model
from .reference import max_rel_error, random_inputs, run_onnxruntime
from .targets import load_target


def time_onnxruntime(onnx_model, inputs, repeat: int = 50) -> float:
    """Median latency of ONNX Runtime (CPU provider, default threads) in ms."""
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    for _ in range(5):
        sess.run(None, feed)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def run_demo(*, trials: int = 80, logs: str | None = None, target: str = "host") -> int:
    """Import, plan, tune, compile and check the embedded model; print one table.

    Returns the process exit status: 1 when the tuned build disagrees with ONNX Runtime.
    """
    hw = load_target(target)
    logs = logs or tempfile.mkdtemp(prefix="tvm-fusion-demo-")
    stages = []

    def stage(name, fn):
        t = time.perf_counter()
        out = fn()
        stages.append((name, time.perf_counter() - t))
        return out

    print(f"tvm-fusion demo: embedded model on {hw.name} "
          f"({hw.tvm_config.get('mcpu', hw.tvm_config.get('kind'))}), {trials} trials, "
          f"logs in {logs}")
    model = stage("import", lambda: import_model(build_embedded_model(), name="embedded"))
    plan = stage("plan", lambda: plan_fusion(build_graph(model.mod), hw))
    print(plan.summary())
    report = stage("tune", lambda: tune(model, hw, trials=trials, logs=logs))
    tuned = stage("compile", lambda: compile_model(model, hw, logs=logs))
    plain = compile_model(model, hw, logs=None)
    work = Path(tempfile.mkdtemp(prefix="tvm-fusion-demo-build-"))
    tuned_mod = load_module(tuned.export(work / "tuned.so"))
    plain_mod = load_module(plain.export(work / "unscheduled.so"))

    inputs = random_inputs(model.inputs, seed=0)
    ref = run_onnxruntime(model.onnx_model, inputs)
    rows = []
    for name, mod in (("TVM, unscheduled (same plan)", plain_mod), ("tvm-fusion, tuned", tuned_mod)):
        err = max(max_rel_error(g, w) for g, w in zip(mod(*inputs), ref))
        rows.append((name, mod.benchmark(*inputs)["median_ms"], err))
    rows.append(("ONNX Runtime", time_onnxruntime(model.onnx_model, inputs), 0.0))

    print()
    print(f"{'stage':<10} {'seconds':>8}")
    for name, secs in stages:
        print(f"{name:<10} {secs:>8.1f}")
    print(f"kernels: {len(plan.groups)} ({len(tuned.untuned)} without a record); "
          f"trials: {report.trials_total}; rejected by verification: {report.rejected}")
    ort_ms = rows[-1][1]
    print(f"{'system':<30} {'median ms':>10} {'x ORT':>7} {'max rel err':>12}")
    for name, ms_, err in rows:
        print(f"{name:<30} {ms_:>10.4f} {ms_ / ort_ms:>7.2f} {err:>12.2e}")
    ok = rows[1][2] <= 1e-4
    print("outputs match ONNX Runtime (rtol 1e-4)" if ok else "OUTPUTS DIFFER from ONNX Runtime")
    return 0 if ok else 1
