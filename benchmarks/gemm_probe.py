"""GEMM probe: MiniLM's fp32 matmuls tuned with and without tvm-fusion's CPU rules, next to numpy.

Shapes (M x K x N): 128 x 384 x 1536 (the FFN's first matmul, also with its bias + GELU
epilogue fused) and 128 x 1536 x 384 (the second). The weight is a layout-free buffer,
as prepacking marks it, so MetaSchedule's RewriteLayout packs it to the schedule's
liking; the timed kernel reads the packed weight (the packing runs once, at load).

Each kernel is tuned twice with the same search (the driver's evolutionary search
settings, MetaSchedule's XGBoost model, the same seed and trial budget): in the shipped
``search_spaces/cpu.json`` ("rules") and in the same file without tvm-fusion's rules
("stock", MetaSchedule's default space). Then the best schedule of each is timed in
rounds interleaved with numpy's matmul on the same shape. numpy runs in a subprocess
whose environment lacks OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (some machines set
values that halve OpenBLAS; benchmarks/roofline.py removes them the same way); the
subprocess reports which BLAS kernel runs (threadpoolctl, if installed).

Run: ``python -m benchmarks.gemm_probe --trials 32 [--out results-gemm-probe.json]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.roofline import UNSET

SHAPES = (("ffn1", 128, 384, 1536, False), ("ffn1+bias+gelu", 128, 384, 1536, True),
          ("ffn2", 128, 1536, 384, False))

_NUMPY = r"""
import json, os, sys, time
import numpy as np
m, k, n, reps = (int(x) for x in sys.argv[1:5])
rng = np.random.default_rng(0)
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n), dtype=np.float32)
c = np.empty((m, n), dtype=np.float32)
for _ in range(10):
    np.matmul(a, b, out=c)
times = []
for _ in range(reps):
    t = time.perf_counter(); np.matmul(a, b, out=c); times.append(time.perf_counter() - t)
blas = []
try:
    from threadpoolctl import threadpool_info
    blas = [{k: i.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for i in threadpool_info()]
except ImportError:
    pass
print(json.dumps({"best_s": min(times), "median_s": float(np.median(times)), "blas": blas}))
"""


def numpy_time(m: int, k: int, n: int, reps: int = 200) -> dict:
    """numpy's matmul on (m, k) x (k, n) in a subprocess without the OpenBLAS overrides."""
    env = {key: v for key, v in os.environ.items() if key not in UNSET}
    proc = subprocess.run([sys.executable, "-c", _NUMPY, str(m), str(k), str(n), str(reps)],
                          env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def kernel(m: int, k: int, n: int, epilogue: bool):
    """The PrimFunc: matmul (+ bias + erf GELU, as MiniLM's FFN), weight layout-free."""
    import tvm
    from tvm import te

    a = te.placeholder((m, k), name="a")
    w = te.placeholder((k, n), name="w")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r), name="matmul")
    args = [a, w]
    if epilogue:
        bias = te.placeholder((n,), name="bias")
        d = te.compute((m, n), lambda i, j: c[i, j] + bias[j], name="add")
        c = te.compute((m, n), lambda i, j: d[i, j] * 0.5 * (1.0 + te.erf(
            d[i, j] * 0.7071067811865476)), name="gelu")
        args.append(bias)
    func = te.create_prim_func([*args, c]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func.with_attr("layout_free_buffers", [1])})


def stock_space():
    """cpu.json without tvm-fusion's rules: MetaSchedule's default CPU space."""
    from tvm_fusion.tune.space import SPACE_DIR, space_from_dict

    doc = json.loads((SPACE_DIR / "cpu.json").read_text())
    ours = ("plain", "register_tile", "depthwise")
    doc["rules"] = [r for r in doc["rules"] if r not in ours]
    doc.update({r: None for r in ours})
    # tile_choice mutates register_tile's categorical; MetaSchedule's own probabilities
    mut = doc["mutators"]
    mut["tile_size"] = mut.get("tile_size", 0) + mut.pop("tile_choice", 0)
    return space_from_dict(doc, origin="cpu.json without tvm-fusion's rules")


def tune_best(mod, target, space, trials: int, seed: int, work_dir: str):
    """Tune ``mod`` in ``space``: (best schedule, its tags, records measured, best
    register_tile schedule or None)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion.tune.fast_import import build_kernel
    from tvm_fusion.tune.measure import make_runner
    from tvm_fusion.tune.space import space_generator

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    strategy = ms.search_strategy.EvolutionarySearch(  # the driver's settings
        population_size=64, init_min_unmeasured=16, genetic_num_iters=1)
    db = ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=16,
                     space=space_generator(space, target), strategy=strategy, seed=seed,
                     builder=ms.builder.LocalBuilder(timeout_sec=60, f_build=build_kernel),
                     runner=make_runner(), cost_model="xgb")
    recs = [r for r in db.get_all_tuning_records() if r.run_secs]

    def secs(r):
        return float(np.median([float(x) for x in r.run_secs]))

    def tags(r):
        return sorted({str(i.inputs[1]).strip('"') for i in r.trace.insts
                       if i.kind.name == "Annotate" and "tvm_fusion." in str(i.inputs[1])})

    def scheduled(r):
        sch = tvm.s_tir.Schedule(mod)
        r.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch.mod

    def tiles_of(r):  # the sampled tile sizes, outer to inner, per split loop
        return [[int(x) for x in r.trace.decisions[i]] for i in r.trace.insts
                if i.kind.name == "SamplePerfectTile"]

    best = min(recs, key=secs)
    tiles = [r for r in recs if "tvm_fusion.register_tile" in tags(r)]
    tile = min(tiles, key=secs) if tiles else None
    return (scheduled(best), tags(best) + [f"tiles={tiles_of(best)}"], len(recs),
            None if tile is None else (scheduled(tile), [f"tiles={tiles_of(tile)}"]))


def tvm_time(mod, target, reps: int = 200) -> float:
    """Best time (s) of the tuned kernel on random inputs; the weight already packed."""
    import tvm

    from tvm_fusion.tune.fast_import import build_kernel

    lib = build_kernel(mod, target, None)  # drops the packing block: reads packed weights
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    func = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)["main"]
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape],
                                                   dtype=np.float32)) for p in func.params]
    timer = lib.time_evaluator("main", tvm.cpu(), number=1, repeat=reps, min_repeat_ms=0)
    timer(*args)  # warm-up
    return min(timer(*args).results)


def check(mod, target, m, k, n, epilogue) -> float:
    """Max abs error of the tuned kernel (packing included) against numpy, on random data."""
    import tvm
    from scipy.special import erf

    lib = tvm.tirx.build(mod, target=target)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    want = a @ w
    ins = [a, w] + ([bias] if epilogue else [])
    if epilogue:
        d = want + bias
        want = d * 0.5 * (1 + erf(d * 0.7071067811865476))
    out = tvm.runtime.tensor(np.zeros((m, n), np.float32))
    lib(*[tvm.runtime.tensor(x) for x in ins], out)
    return float(np.abs(out.numpy() - want).max() / max(1.0, np.abs(want).max()))


def _label(arm: str, tags: list[str]) -> str:
    rules = [t.removeprefix("tvm_fusion.") for t in tags if t.startswith("tvm_fusion.")]
    tiles = [t for t in tags if t.startswith("tiles=")]
    kind = ",".join(rules) or ("register_tile" if "register" in arm else "stock tiling")
    return f"{kind} {tiles[0] if tiles else ''}".strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32, help="trials per kernel and space")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="comma-separated kernel names")
    ap.add_argument("--arms", default="rules,stock",
                    help="comma-separated spaces to tune: rules (cpu.json), stock (without "
                         "tvm-fusion's rules)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    import tvm

    from tvm_fusion.targets import load_target
    from tvm_fusion.tune.fast_import import import_tensor_intrinsics
    from tvm_fusion.tune.space import load_search_space

    import_tensor_intrinsics()
    target = load_target("host").tvm_target()
    makers = {"rules": lambda: load_search_space("cpu"), "stock": stock_space}
    spaces = {arm: makers[arm]() for arm in args.arms.split(",")}
    rows = []
    for name, m, k, n, epi in SHAPES:
        if args.only and name not in args.only.split(","):
            continue
        mod = kernel(m, k, n, epi)
        tuned = {}
        for arm, space in spaces.items():
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="gemm-probe-") as wd:
                best, tags, measured, tile = tune_best(mod, target, space, args.trials,
                                                       args.seed, wd)
            tuned[arm] = (best, tags, measured, time.monotonic() - t0,
                          check(best, target, m, k, n, epi))
            if tile is not None and arm == "rules":  # what the micro-kernel itself reaches
                tuned["rules-best-register-tile"] = (tile[0], tile[1], measured, 0.0,
                                                     check(tile[0], target, m, k, n, epi))
        times = {arm: [] for arm in tuned}
        times["numpy"] = []
        blas = []
        for _ in range(args.rounds):  # interleaved, so the machine's noise hits all alike
            np_res = numpy_time(m, k, n)
            times["numpy"].append(np_res["best_s"])
            blas = np_res["blas"]
            for arm, (best, *_rest) in tuned.items():
                times[arm].append(tvm_time(best, target))
        flops = 2.0 * m * k * n
        row = {"kernel": name, "m": m, "k": k, "n": n, "trials": args.trials, "blas": blas,
               "numpy_us": min(times["numpy"]) * 1e6,
               "numpy_gflops": flops / min(times["numpy"]) / 1e9}
        for arm, (_best, tags, measured, secs, err) in tuned.items():
            t = min(times[arm])
            row[arm] = {"us": t * 1e6, "gflops": flops / t / 1e9, "best_rules": tags,
                        "measured": measured, "tune_s": round(secs, 1), "rel_err": err,
                        "vs_numpy": t / min(times["numpy"])}
        rows.append(row)
        print(f"{name:16s} {m}x{k}x{n}  numpy {row['numpy_gflops']:6.1f} GFLOP/s  "
              + "  ".join(f"{arm} {row[arm]['gflops']:6.1f} GFLOP/s "
                          f"({row[arm]['vs_numpy']:.2f}x numpy, best: "
                          f"{_label(arm, row[arm]['best_rules'])})" for arm in tuned),
              flush=True)
    result = {"target": str(target), "tvm_threads": tvm.get_global_func("runtime.NumThreads")(),
              "load_average": os.getloadavg(), "unset_for_numpy": {k: os.environ[k] for k in UNSET
                                                         if k in os.environ},
              "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
