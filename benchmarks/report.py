"""Write the results: ``results.json``, ``RESULTS.md`` (tables) and ``results.png`` (chart)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .systems import FUSION, KEYS, ORT, PLAIN, TORCH

JSON_NAME, MD_NAME, PNG_NAME = "results.json", "RESULTS.md", "results.png"

COLUMNS = ("system", "median ms", "p10-p90 ms", "x tvm-fusion", "x floor", "max rel err",
           "kernels (untuned)", "tune s", "compile s", "notes")

METHOD = """\
## Method

- Every system runs the same inputs (deterministic random arrays; silero-vad gets
  sr=16000). ONNX Runtime runs the model file as shipped (CPU provider, default
  threads, all graph optimizations) and is the reference: every other system's outputs
  are compared with its outputs (max over outputs of max|got - want| / max|want|). A
  result over the model's tolerance is shown as WRONG and never ranked. The tolerance is
  1e-4, or 10x ONNX Runtime's own disagreement between its optimized and unoptimized
  sessions where that is larger (ill-conditioned models such as ppocr-det).
- Latency: median over all calls, p10-p90 the spread. Timing is interleaved: each of the
  rounds times every system once for a fixed slot (after a warm-up), rotating the order,
  so that the noise of the shared machine falls on all systems alike. Every call is
  timed from Python, so each system pays its own Python entry cost.
- "x tvm-fusion" is the system's median over tvm-fusion's, in the same run. "x floor" is
  over the roofline floor: max(FLOPs / peak FLOP/s, minimum DRAM bytes / bandwidth),
  with FLOPs summed over `tvm_fusion.build_graph(model.mod)` operators, minimum bytes =
  inputs + weights + outputs once, and the peaks measured by this run on this machine
  (fp32 GEMM through numpy's BLAS with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset; array
  copy counted as read + write).
- Kernels: compiled PrimFuncs the VM calls per inference (call sites); "untuned": those
  that kept their default schedule. n/a for ONNX Runtime and PyTorch.
- Tune s: tuning wall time. Compile s: ONNX Runtime session creation, onnx2torch
  conversion, or the TVM build.
- Stock MetaSchedule is TVM's own `static_shape_tuning` pipeline (FuseOps, FuseTIR,
  MetaScheduleTuneIRMod with the given total trials, MetaScheduleApplyDatabase) with
  `cpu_weight_prepack=True` on CPUs and `max_trials_per_task` the per-task budget (the
  total over its tasks, evenly), as TVM's docs say it runs best on a CPU, then
  `relax.build`, on the Relax module of tvm-fusion's frontend (TVM's own ONNX importer
  rejects several of these models) and with the same target as tvm-fusion (mcpu,
  num-cores).
- Tuning time includes overhead that is not search: MetaSchedule's default builder
  function imports `tvm.s_tir.tensor_intrin` in every build job, and its LocalBuilder
  starts fresh worker processes for every batch, so each worker of each batch pays that
  import (about 25 s alone, up to a minute when two run at once on this 2-core machine).
  tvm-fusion avoids it with its own builder function (`tvm_fusion.compat.fast_import.
  build_kernel`), so the tuning-time comparison is partly about that, not about search.
  The same import is longer than LocalBuilder's default 30 s timeout here: as shipped,
  every stock build times out and nothing is tuned. The harness raises that timeout
  (`--ms-builder-timeout`, recorded below); nothing else of the stock flow is changed.
- Tuning curves (chart, right): after each trial, the sum over tuning tasks of the best
  kernel latency measured so far times its calls per inference: each tuner's own kernel
  measurements, not an end-to-end run. Dotted while some tasks have no measurement yet.
"""


def _fmt(x, spec=".3g", none="n/a"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, spec)


def _ms(x):
    if x is None:
        return "n/a"
    return f"{x:.4f}" if x < 0.1 else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _latency_cell(row: dict) -> str:
    status = row["status"]
    if status in ("ok", "unchecked"):
        return _ms(row.get("median_ms")) + (" (unchecked)" if status == "unchecked" else "")
    if status == "wrong":
        timed = f" ({_ms(row['median_ms'])} ms, not a result)" if "median_ms" in row else ""
        return "WRONG" + timed
    if status == "untimed":
        return "= tvm-fusion row (same logs)"
    return f"{status}: {row['reason']}" if row.get("reason") else status


def ranked(row: dict) -> bool:
    return row["status"] in ("ok", "unchecked") and "median_ms" in row


def table_rows(model: dict) -> list[list[str]]:
    rows = model["rows"]
    fusion = next((r for r in rows if r["key"] == FUSION and ranked(r)), None)
    floor = model.get("floor_ms")
    out = []
    for r in rows:
        good = ranked(r)
        spread = f"{_ms(r['p10_ms'])}-{_ms(r['p90_ms'])}" if "p10_ms" in r else "n/a"
        ratio = (f"{r['median_ms'] / fusion['median_ms']:.2f}" if good and fusion else "n/a")
        xfloor = f"{r['median_ms'] / floor:.1f}" if good and floor else "n/a"
        if r["key"] == ORT and r["status"] != "failed":
            err = "reference"
        else:
            err = _fmt(r.get("max_err"), ".1e")
        if r["key"] in (ORT, TORCH):
            kernels, tune = "n/a", "n/a"
        else:
            kernels = (f"{r['kernels']} ({r['untuned']})" if r.get("kernels") is not None
                       else "n/a")
            built = r["status"] in ("ok", "wrong", "untimed", "unchecked")
            tune = "0" if r["key"] == PLAIN and built else _fmt(r.get("tune_s"), ".1f")
        out.append([r["label"], _latency_cell(r), spread, ratio, xfloor, err, kernels, tune,
                    _fmt(r.get("compile_s"), ".2f"), "; ".join(r.get("notes", []))])
    return out


def markdown(results: dict) -> str:
    m = results["machine"]
    s = results["settings"]
    lines = ["# tvm-fusion benchmark results", "",
             f"Run {results['created']}: `{results['command']}`", "",
             f"- Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores; target "
             f"`{json.dumps(m.get('target'))}`; TVM threads {m.get('tvm_threads', '?')}",
             f"- Peaks for the floor: {_fmt(m.get('peak_gflops'), '.0f')} GFLOP/s fp32 GEMM, "
             f"{_fmt(m.get('bandwidth_gbs'), '.1f')} GB/s copy (read + write); "
             + (f"given on the command line: {', '.join(m['given'])}" if m.get("given")
                else "measured by this run")
             + (f"; unset for the probe: {m['unset_for_probe']}" if m.get("unset_for_probe")
                else ""),
             f"- Load average at start {m.get('loadavg_start')}, at end {m.get('loadavg_end')}"
             " (the machine is shared: read the spreads)",
             f"- Versions: {m.get('versions')}",
             f"- Settings: {s['trials']} trials, {s['rounds']} timing rounds x {s['slot_ms']} ms "
             f"per system, MetaSchedule builder timeout {s['ms_builder_timeout']} s, "
             f"logs for the from-logs row: {s['logs'] or 'those the tvm-fusion row writes'}",
             ""]
    if results["models"]:
        lines += ["## Summary: median latency in ms (x tvm-fusion)", ""]
        labels = [r["label"] for r in results["models"][0].get("rows", [])] or list(KEYS)
        lines += ["| model | floor ms | " + " | ".join(labels) + " |",
                  "|---|---|" + "---|" * len(labels)]
        for model in results["models"]:
            cells = []
            for r in table_rows(model) if model.get("rows") else []:
                cells.append(r[1] if r[3] == "n/a" else f"{r[1]} ({r[3]}x)")
            if not cells:
                cells = [f"skipped: {model.get('error', '')}"] + [""] * (len(labels) - 1)
            lines.append(f"| {model['name']} | {_ms(model.get('floor_ms'))} | "
                         + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    for model in results["models"]:
        lines += [f"## {model['name']}", "", model.get("description", ""), ""]
        if model.get("error"):
            lines += [f"Skipped: {model['error']}", ""]
            continue
        cost = model["cost"]
        flops = (f"{cost['flops'] / 1e9:.3f} GFLOP" if cost.get("flops") is not None
                 else cost.get("flops_note") or "FLOPs unknown")
        lines += [
            f"Inputs {model['shapes']}; {flops}; minimum DRAM traffic "
            f"{cost['min_bytes'] / 1e6:.2f} MB (weights {cost['weight_bytes'] / 1e6:.2f} MB); "
            f"roofline floor {_ms(model.get('floor_ms'))} ms; tolerance {model['tol']:.0e} "
            f"(ONNX Runtime optimized vs unoptimized: {_fmt(model.get('ort_self_err'), '.1e')}).",
            "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for cells in table_rows(model):
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        below = [r["label"] for r in model["rows"]
                 if ranked(r) and model.get("floor_ms") and r["median_ms"] < model["floor_ms"]]
        if below:
            lines.append(f"\nBelow the roofline floor: {', '.join(below)}. The peaks used "
                         "are lower than what this machine reaches (measured on a busy "
                         "machine?): pass --peak-gflops/--bandwidth-gbs measured on a quiet "
                         "one.")
        for key, c in (model.get("curves") or {}).items():
            if c.get("note"):
                lines.append(f"\nTuning curve of {key}: {c['note']}.")
        lines.append("")
    lines.append(METHOD)
    return "\n".join(lines)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in results["models"] if m.get("rows")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [3, 2]})
    keys = [r["key"] for r in models[0]["rows"]] if models else []
    labels = {r["key"]: r["label"] for m in models for r in m["rows"]}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(len(keys), 1)
    seen = set()
    for j, key in enumerate(keys):
        for i, model in enumerate(models):
            r = next((x for x in model["rows"] if x["key"] == key), None)
            x = i + (j - (len(keys) - 1) / 2) * width
            if r is None or "median_ms" not in r:
                if r is not None and r["status"] not in ("skipped", "untimed"):
                    ax1.annotate(r["status"][0].upper(), (x, 0), xycoords=("data", "axes fraction"),
                                 xytext=(0, 3), textcoords="offset points", ha="center",
                                 fontsize=7, color=colors[j % len(colors)])
                continue
            y = r["median_ms"]
            err = [[y - r["p10_ms"]], [r["p90_ms"] - y]]
            ax1.bar(x, y, width, color=colors[j % len(colors)],
                    hatch="xx" if r["status"] == "wrong" else None,
                    alpha=0.4 if r["status"] == "wrong" else 1.0,
                    label=None if key in seen else labels[key], yerr=err, capsize=2)
            seen.add(key)
    for i, model in enumerate(models):
        if model.get("floor_ms"):
            ax1.hlines(model["floor_ms"], i - 0.45, i + 0.45, colors="k", linestyles="--",
                       label="roofline floor" if i == 0 else None)
    ax1.set_yscale("log")
    ax1.set_xticks(range(len(models)), [m["name"] for m in models], rotation=15)
    ax1.set_ylabel("latency, ms (median, p10-p90 bars; log)")
    ax1.set_title("Latency per system (F failed, U unavailable; hatched: wrong)", fontsize=10)
    ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)

    drawn = []
    for i, model in enumerate(models):
        color = colors[i % len(colors)]
        for key, style, marker in (("tvm-fusion", "-", "o"), ("metaschedule", "--", "x")):
            c = (model.get("curves") or {}).get(key)
            row = next((r for r in model["rows"] if r["key"] == key), None)
            if row is None or row["status"] == "skipped":
                continue
            if not c or not c.get("trials"):
                drawn.append(f"{model['name']} {key}: no curve"
                             + (f" ({c['note']})" if c and c.get("note") else ""))
                continue
            t, e, ok = c["trials"], c["est_ms"], c["complete"]
            full = [(a, b) for a, b, k in zip(t, e, ok) if k]
            part = [(a, b) for a, b, k in zip(t, e, ok) if not k]
            if part:
                ax2.plot(*zip(*part), linestyle=":", color=color, marker=marker, markersize=3,
                         alpha=0.5, label=None if full else
                         f"{model['name']} {key} (partial: not every task measured)")
            if full:
                ax2.plot(*zip(*full), linestyle=style, color=color, marker=marker,
                         markersize=3, label=f"{model['name']} {key}")
    ax2.set_yscale("log")
    ax2.set_xlabel("trials")
    ax2.set_ylabel("estimated latency, ms (sum of best kernels x calls)")
    ax2.set_title("Tuning curves (o tvm-fusion, x MetaSchedule; dotted: partial)", fontsize=10)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    if drawn:
        ax2.text(0.01, 0.01, "\n".join(drawn)[:600], transform=ax2.transAxes, fontsize=6,
                 va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(results: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / JSON_NAME, "markdown": out / MD_NAME, "png": out / PNG_NAME}
    paths["json"].write_text(json.dumps(_jsonable(results), indent=1) + "\n")
    paths["markdown"].write_text(markdown(results))
    try:
        chart(results, paths["png"])
    except Exception as err:  # noqa: BLE001 - the tables stay useful without the chart
        print(f"chart not written: {type(err).__name__}: {err}")
        paths.pop("png")
    return paths
