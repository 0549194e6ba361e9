"""``python -m benchmarks.run``: tvm-fusion against its peers, model by model, in one run.

For each model, on the same inputs: ONNX Runtime (the reference), PyTorch via
onnx2torch, TVM's unscheduled build, stock FuseOps + MetaSchedule through TVM's
``static_shape_tuning`` pipeline, tvm-fusion tuned with the same trials, and tvm-fusion
compiled from logs with no tuning. Outputs are checked against ONNX Runtime, latencies
timed interleaved, and everything is written to ``--out`` as ``results.json``,
``RESULTS.md`` and ``results.png`` (rewritten after every model, so a long run that
stops keeps what it finished). See ``benchmarks/METHODS.md``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path

from . import models as model_registry
from .systems import DEFAULT_KEYS, FROM_LOGS, FUSEOPS_PLAN, FUSION, KEYS, MS, ORT, PREPARE, Context, Row, \
    labels, max_error, prepare_ort, run_system, short_reason

DEFAULT_TOL = 1e-4


def _log_factory():
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)

    return log


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=model_registry.EMBEDDED,
                   help=f"comma-separated, from: {', '.join(model_registry.NAMES)} "
                        "(or 'all'); default: embedded")
    p.add_argument("--trials", type=int, default=64,
                   help="tuning trials per model for MetaSchedule and for tvm-fusion")
    p.add_argument("--target", default="host", help="a tvm-fusion target name (default host)")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default ~/.cache/tvm-fusion/benchmarks/<time>)")
    p.add_argument("--logs", type=Path, default=None,
                   help="shipped tvm-fusion logs (a directory holding <target>/) for the "
                        "from-logs row; default: the logs the tvm-fusion row just wrote")
    p.add_argument("--resume", action="store_true",
                   help="keep the tvm-fusion logs already in --out/work and tune only up to "
                        "--trials (re-times a finished run without re-tuning; stock "
                        "MetaSchedule always starts afresh)")
    p.add_argument("--ms-resume", action="store_true",
                   help="apply the stock MetaSchedule database already in "
                        "--out/work/<model>/metaschedule instead of tuning afresh (re-times "
                        "an earlier run's MetaSchedule row; give the --ms-per-task it was "
                        "tuned with)")
    p.add_argument("--list", action="store_true", help="list the models and whether each runs")
    p.add_argument("--systems", default=",".join(DEFAULT_KEYS),
                   help=f"comma-separated subset of: {', '.join(KEYS)} (others are shown "
                        f"as skipped); default: all but {FUSEOPS_PLAN}, the planner "
                        "ablation (our tuner on FuseOps' plan)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--slot-ms", type=float, default=300.0,
                   help="time per system per round, ms")
    p.add_argument("--ms-builder-timeout", type=float, default=180.0,
                   help="LocalBuilder timeout for stock MetaSchedule, s (TVM's default, 30, is "
                        "shorter than its workers' start-up here: every build times out)")
    p.add_argument("--ms-per-task", type=int, default=None,
                   help="stock MetaSchedule's max_trials_per_task (default: --trials shared "
                        "evenly over its tasks, rounded up); set it to tvm-fusion's trials per "
                        "task to compare at the same per-task budget when the two tuners "
                        "count different tasks")
    p.add_argument("--ms-population", type=int, default=None,
                   help="stock MetaSchedule's evolutionary search population (default "
                        "MetaSchedule's 512; the smoke tests use a small one)")
    p.add_argument("--peak-gflops", type=float, default=None,
                   help="use this fp32 peak (GFLOP/s) for the floor instead of the one measured")
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="use this bandwidth (GB/s, read + write) instead of the one measured")
    args = p.parse_args(argv)
    names = list(model_registry.NAMES) if args.models == "all" else \
        [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in model_registry.NAMES]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(model_registry.NAMES)}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in KEYS]
    if bad:
        p.error(f"unknown system(s) {bad}; known: {', '.join(KEYS)}")
    if args.trials < 1:
        p.error("--trials must be at least 1")
    if args.ms_per_task is not None and args.ms_per_task < 1:
        p.error("--ms-per-task must be at least 1")
    args.model_names, args.system_keys = names, systems
    return args


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def list_models() -> int:
    print("models (status: ok = every system runs; partial = some rows fail, see note; "
          "skipped = cannot be benchmarked):")
    for name in model_registry.NAMES:
        status, note = model_registry.availability(name)
        print(f"  {name:<18} {status:<8} {note}")
        print(f"  {'':<18} {'':<8} {model_registry.describe(name)}")
    for dist in ("torch", "onnx2torch", "onnxruntime", "matplotlib"):
        print(f"  package {dist}: {_version(dist)}")
    return 0


def bench_model(name: str, args, hw, machine: dict, out: Path, log) -> dict:
    from .curves import fusion_curve, metaschedule_curve
    from .roofline import floor_ms, model_cost
    from .timing import interleave

    entry = {"name": name, "description": model_registry.describe(name)}
    log(f"{name}: importing")
    try:
        model = model_registry.load(name)
    except Exception as err:  # noqa: BLE001 - a model that cannot load is reported, not fatal
        entry["error"] = short_reason(err)
        log(f"{name}: skipped: {entry['error']}")
        return entry
    entry["shapes"] = {k: list(v) for k, v in model.shapes.items()}
    inputs = model.inputs()
    cost = model_cost(model.imported)
    entry["cost"], entry["floor_ms"] = cost, floor_ms(cost, machine)
    graph_note = model_registry.graph_check(model) if cost.get("flops") is None else None
    if graph_note:
        entry["graph_note"] = graph_note
    flops = "unknown" if cost["flops"] is None else f"{cost['flops']:.3g}"
    log(f"{name}: {flops} FLOPs, {cost['min_bytes'] / 1e6:.2f} MB, floor "
        f"{entry['floor_ms']:.4f} ms")
    ctx = Context(model=model, inputs=inputs, hw=hw, trials=args.trials,
                  work=out / "work" / name, logs=args.logs,
                  ms_builder_timeout=args.ms_builder_timeout, resume=args.resume,
                  ms_population=args.ms_population, ms_per_task=args.ms_per_task,
                  ms_resume=args.ms_resume)
    names = labels(args.trials)
    rows = [Row(key, names[key]) for key in KEYS]

    # ONNX Runtime first: its outputs are the reference for every other system.
    ref, tol = None, DEFAULT_TOL
    ort_row = rows[0]
    try:
        call, outputs = prepare_ort(ctx, ort_row)
        ref = outputs()
        ort_row.status, ort_row.max_err, ort_row.call = "ok", 0.0, call
        plain_row = Row(ORT, "ORT unoptimized")
        _, plain_outputs = prepare_ort(ctx, plain_row, optimize=False)
        entry["ort_self_err"] = max_error(plain_outputs(), ref)
        tol = max(DEFAULT_TOL, 10 * entry["ort_self_err"])
        log(f"  [{ORT}] ok (reference; optimized vs unoptimized {entry['ort_self_err']:.1e}, "
            f"tolerance {tol:.0e})")
    except Exception as err:  # noqa: BLE001
        ort_row.status, ort_row.reason = "failed", short_reason(err)
        log(f"  [{ORT}] failed: {ort_row.reason}; outputs cannot be checked")
    entry["tol"] = tol

    for row in rows[1:]:
        if row.key not in args.system_keys:
            row.status, row.reason = "skipped", "not in --systems"
            continue
        if graph_note and row.key in (FUSEOPS_PLAN, FUSION, FROM_LOGS):
            row.status = "failed"
            row.reason = f"tvm-fusion's graph stage rejects the model: {graph_note}"
            log(f"  [{row.key}] failed: {row.reason}")
            continue
        run_system(PREPARE[row.key], ctx, row, ref, tol, log=log)

    log(f"{name}: timing {sum(r.call is not None for r in rows)} systems, {args.rounds} "
        f"rounds x {args.slot_ms:.0f} ms")
    interleave(rows, rounds=args.rounds, slot_s=args.slot_ms / 1e3, log=log)

    for r in rows:
        st = r.stats()
        if st and st["p90_ms"] > 3 * st["p10_ms"] and st["p90_ms"] - st["p10_ms"] > 0.05:
            r.notes.append(f"unstable timing: p90 is {st['p90_ms'] / st['p10_ms']:.0f}x p10 "
                           "(a busy machine; see README on OpenMP threads)")
    curves = {}
    if ctx.fusion_logs is not None:
        try:
            curves["tvm-fusion"] = fusion_curve(model.imported, hw, ctx.fusion_logs)
        except Exception as err:  # noqa: BLE001
            curves["tvm-fusion"] = {"trials": [], "note": f"not available: {short_reason(err)}"}
    ms_dir = ctx.work / "metaschedule"
    if (ms_dir / "database_tuning_record.json").is_file():
        try:
            ms_row = next((r for r in rows if r.key == MS), None)
            prepack = bool(ms_row.extra.get("prepack")) if ms_row else False
            curves["metaschedule"] = metaschedule_curve(model.imported, hw, ms_dir, prepack)
        except Exception as err:  # noqa: BLE001
            curves["metaschedule"] = {"trials": [], "note": f"not available: {short_reason(err)}"}
    entry["curves"] = curves
    entry["rows"] = [r.to_json() for r in rows]
    for r in rows:
        r.call = None  # let the VMs and sessions go before the next model
        st = r.stats()
        log(f"  {r.label:<44} {r.status:<11} "
            + (f"{st['median_ms']:.4f} ms (p10 {st['p10_ms']:.4f}, p90 {st['p90_ms']:.4f})"
               if st else r.reason[:100]))
    return entry


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        return list_models()
    log = _log_factory()
    out = args.out or (Path.home() / ".cache" / "tvm-fusion" / "benchmarks"
                       / time.strftime("%Y%m%d-%H%M%S"))
    out = out.resolve()
    log(f"output: {out}")

    import tvm_fusion
    from tvm_fusion import load_target
    from tvm_fusion.compat.fast_import import import_tensor_intrinsics

    from .report import write_all
    from .roofline import measure_machine

    import_tensor_intrinsics()  # 25 s -> 3 s in this process (MetaSchedule imports it)
    hw = load_target(args.target)
    log(f"target {hw.name}: {dict(hw.tvm_config)}; measuring peak GEMM and copy bandwidth")
    import tvm

    machine = {"cpu": _cpu_name(), "cores": os.cpu_count(), "target": dict(hw.tvm_config),
               # TVM's pool size (tvm_fusion sets every core unless TVM_NUM_THREADS is set)
               "tvm_threads": int(tvm.get_global_func("runtime.NumThreads")()),
               "loadavg_start": [round(x, 2) for x in os.getloadavg()],
               "versions": {**{d: _version(d) for d in ("apache-tvm", "onnxruntime", "torch",
                                                         "onnx2torch", "numpy")},
                            "tvm-fusion": tvm_fusion.__version__}}
    if args.peak_gflops is None or args.bandwidth_gbs is None:
        machine.update(measure_machine())
        machine["measured"] = {k: machine[k] for k in ("peak_gflops", "bandwidth_gbs")}
    given = {"peak_gflops": args.peak_gflops, "bandwidth_gbs": args.bandwidth_gbs}
    machine.update({k: v for k, v in given.items() if v is not None})
    machine["given"] = [k for k, v in given.items() if v is not None]
    log(f"peak {machine['peak_gflops']:.0f} GFLOP/s, copy {machine['bandwidth_gbs']:.1f} GB/s"
        + (f" ({', '.join(machine['given'])} given, not measured)" if machine["given"] else ""))
    results = {
        "schema": "tvm-fusion/benchmarks", "version": 1,
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine,
        "settings": {"trials": args.trials, "rounds": args.rounds, "slot_ms": args.slot_ms,
                     "ms_builder_timeout": args.ms_builder_timeout,
                     "ms_population": args.ms_population, "ms_per_task": args.ms_per_task,
                     "target": hw.name,
                     "logs": str(args.logs) if args.logs else None,
                     "systems": args.system_keys},
        "models": [],
    }
    status = 0
    try:
        for name in args.model_names:
            results["models"].append(bench_model(name, args, hw, machine, out, log))
            machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
            write_all(results, out)
    except KeyboardInterrupt:
        log("interrupted: writing what is finished")
        status = 130
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    paths = write_all(results, out)
    log("wrote " + ", ".join(str(p) for p in paths.values()))
    return status


if __name__ == "__main__":
    sys.exit(main())
