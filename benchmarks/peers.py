"""Time runtimes on one model, each alone in its own process, rounds alternated.

Two runtimes timed call by call in one process disturb each other: their thread pools
spin after each call (tvm-fusion's ResNet-50 took 49.8 ms right after ONNX Runtime calls,
11.9 ms with ORT's spinning off). Here every (round, system) is a fresh process that
loads its runtime, warms up, and times ``--runs`` calls on the same seeded inputs; the
systems take turns in each round, in rotated order.

    python -m benchmarks.peers MODEL.onnx [--shape x=1,3,224,224] \
        --system ort --system openvino --system so:/tmp/a.so --rounds 5

Systems: ``ort`` (ONNX Runtime, CPU provider, all optimizations, its default threads),
``openvino`` (CPU, ``INFERENCE_PRECISION_HINT=f32``: it runs bf16 on AVX-512 machines
otherwise), ``so:PATH`` (a library written by ``tvm-fusion compile``). Reports each
system's median over rounds and its best round (ONNX Runtime is bimodal on shared
cores: its best round is its fair number).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _inputs(model_path: str, shapes: dict, seed: int = 0):
    import numpy as np
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    init = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        t = vi.type.tensor_type
        shape = shapes.get(vi.name) or [d.dim_value or 1 for d in t.shape.dim]  # dynamic: 1
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        out[vi.name] = (rng.standard_normal(shape).astype(dtype) if dtype.kind == "f"
                        else np.zeros(shape, dtype))
    return out


def _timed(fn, runs: int) -> list[float]:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def _worker(system: str, model_path: str, shapes: dict, runs: int, feeds_npz=None) -> dict:
    if feeds_npz:
        import numpy as np
        with np.load(feeds_npz) as z:
            feeds = {k: z[k] for k in z.files}
    else:
        feeds = _inputs(model_path, shapes)
    if system == "ort":
        import onnxruntime as ort
        sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        fn = lambda: sess.run(None, feeds)  # noqa: E731
    elif system == "openvino":
        import openvino as ov
        core = ov.Core()
        model = core.read_model(model_path)
        model.reshape({k: list(v.shape) for k, v in feeds.items()})
        compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        fn = lambda: request.infer(feeds)  # noqa: E731
    elif system.startswith("so:"):
        import tvm_fusion as tf
        mod = tf.load_module(system[3:])
        args = [feeds[t["name"]] for t in mod.info["inputs"]]  # consts are folded in
        fn = lambda: mod(*args)  # noqa: E731
    else:
        raise SystemExit(f"unknown system {system!r}: ort, openvino or so:PATH")
    return {"system": system, "ms": statistics.median(_timed(fn, runs))}


def _parse_shapes(items) -> dict:
    out = {}
    for item in items or ():
        name, dims = item.split("=", 1)
        out[name] = [int(d) for d in dims.split(",")]
    return out


def run(model_path: str, systems: list[str], *, shapes=None, rounds: int = 5,
        runs: int = 20, feeds_npz=None) -> dict:
    """Each system's per-round medians (ms), alternated rounds, one process each."""
    shapes = shapes or {}
    result = {s: [] for s in systems}
    for r in range(rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for system in order:
            cmd = [sys.executable, "-m", "benchmarks.peers", model_path, "--worker", system,
                   "--runs", str(runs)] + [f"--shape={n}={','.join(map(str, d))}"
                                           for n, d in shapes.items()]
            if feeds_npz:
                cmd += ["--feeds", str(feeds_npz)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                result[system].append(None)
                print(f"  {system}: failed: {tail}", file=sys.stderr)
                continue
            ms = json.loads(proc.stdout.strip().splitlines()[-1])["ms"]
            result[system].append(ms)
            print(f"  round {r + 1} {system}: {ms:.3f} ms", file=sys.stderr)
    return result


def summary(result: dict) -> dict:
    """``{system: {"median": ms, "best": ms, "rounds": [...]}}`` over the rounds that ran."""
    out = {}
    for system, rounds in result.items():
        ok = [r for r in rounds if r is not None]
        out[system] = {"median": statistics.median(ok) if ok else None,
                       "best": min(ok) if ok else None, "rounds": rounds}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--system", action="append", default=[])
    p.add_argument("--shape", action="append")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--feeds", help="inputs as an .npz of arrays named as the model's inputs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args(argv)
    shapes = _parse_shapes(args.shape)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.model, shapes, args.runs, args.feeds)))
        return 0
    res = summary(run(args.model, args.system or ["ort"], shapes=shapes,
                      rounds=args.rounds, runs=args.runs, feeds_npz=args.feeds))
    for system, s in res.items():
        med = "failed" if s["median"] is None else f"{s['median']:.3f} ms (best {s['best']:.3f})"
        print(f"{system:40s} {med}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
