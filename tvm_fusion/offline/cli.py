"""``tvm-fusion offline export|import``: measure on a device TVM's RPC cannot reach."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..model_spec import load_model_spec
from .bundle import export_bundle, import_measurements

RUNNER = Path(__file__).with_name("runner.py")  # runs on the device, alone


def cmd_export(args) -> int:
    models = [load_model_spec(m, args.shape, simplify=not args.no_simplify)
              for m in args.models]
    out = export_bundle(models, args.target, args.output, candidates=args.candidates,
                        plans=tuple(args.plans.split(",")), seed=args.seed,
                        logs=args.logs, prepack=args.prepack)
    print(f"wrote {out}. On the device (TVM's runtime and numpy suffice):\n"
          f"  TVM_USE_RUNTIME_LIB=1 python {RUNNER.name} {out.name}\n"
          f"({RUNNER.name} is {RUNNER}, copied beside the bundle)\n"
          f"then copy {out.name}/results.jsonl back and run\n"
          f"  tvm-fusion offline import {out} --logs LOGS")
    return 0


def cmd_import(args) -> int:
    s = import_measurements(args.bundle, args.logs, results=args.results)
    print(f"{'model build':<32} {'median ms':>10} {'max rel err':>12}  onnxruntime")
    for label, row in sorted(s.models.items()):
        if "error" in row:
            print(f"{label:<32} {'failed':>10}  {row['error']}")
            continue
        print(f"{label:<32} {row['median_ms']:>10.4f} {row['max_rel_error']:>12.2e}  "
              f"{'matches' if row['matches_onnxruntime'] else 'DIFFERS'}")
    bad = sum(s.rejected.values())
    print(f"{s.records} verified records written for {s.kernels_improved} kernels that beat "
          f"their default schedule; {bad} candidates failed a check")
    return 0


def add_parser(sub) -> None:
    """Add ``offline`` with ``export`` and ``import`` to the CLI's subparsers."""
    p = sub.add_parser(
        "offline", help="build candidates here, time them on a device, import the records",
        description="For a device that runs compiled modules but that TVM's RPC tracker "
                    "cannot reach: `export` builds the models and, per kernel, schedules "
                    "drawn from the target's design space; tvm_fusion/offline/"
                    "runner.py (TVM's runtime and numpy only) checks and times them "
                    "on the device; `import` writes the verified ones as tuning records.")
    osub = p.add_subparsers(dest="offline_command", metavar="ACTION", required=True)
    ex = osub.add_parser("export", help="build a bundle of models and kernel candidates")
    ex.add_argument("models", nargs="+", metavar="MODEL",
                    help="ONNX files, zoo names or `embedded`")
    ex.add_argument("--target", "-t", required=True, help="hardware target of the device")
    ex.add_argument("--shape", action="append", metavar="NAME=D1,D2,...",
                    help="static input shape (applies to every MODEL)")
    ex.add_argument("-o", "--output", required=True, type=Path, metavar="DIR",
                    help="bundle directory to write")
    ex.add_argument("--candidates", type=int, default=16,
                    help="schedules drawn per kernel (default 16; 0: models only)")
    ex.add_argument("--plans", default="cost,fuseops",
                    help="planners whose default-schedule builds are timed (default "
                         "cost,fuseops); kernels come from the cost plan")
    ex.add_argument("--logs", type=Path, default=None,
                    help="also build each model from these logs, timed beside the others")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--prepack", action=argparse.BooleanOptionalAction, default=None,
                    help="draw each kernel's candidates with its constant weights in a "
                         "layout of its own, packed at compile (default on for CPU targets)")
    ex.add_argument("--no-simplify", action="store_true",
                    help="keep each graph as converted (no graph simplification)")
    ex.set_defaults(func=cmd_export)
    im = osub.add_parser("import", help="write a bundle's verified timings as records")
    im.add_argument("bundle", type=Path, metavar="DIR",
                    help="the bundle directory, or a tar archive of it (.tar, .tar.gz: "
                         "extracted into a temporary directory, links and devices refused)")
    im.add_argument("--logs", required=True, type=Path, help="log directory to write")
    im.add_argument("--results", type=Path, default=None,
                    help="directory of the device's results.jsonl (default: the bundle)")
    im.set_defaults(func=cmd_import)
