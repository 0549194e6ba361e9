"""``python -m benchmarks.pretrained``: our tuner with the pretrained cost model against
stock MetaSchedule, on a model the cost model never saw, side by side in one run.

Issue 5's benchmark ("Done means", first bullet). On one model (default ``ppocr-cls``,
the model held out of the shipped x86 cost model's training data), in one process:

1. stock MetaSchedule (TVM's ``static_shape_tuning`` pipeline, its own tuner and cost
   model) with ``--ms-per-task`` (64) trials per tuning task, ``64 x tasks`` in all;
2. optionally (``--ms-same-budget``, on by default) stock MetaSchedule with the total
   budget of our smallest per-task budget;
3. tvm-fusion's tuner with the pretrained model (``tune(...,
   plan_options=PlanOptions(planner="fuseops"),
   search_options=SearchOptions(cost_model=...))``, the kernels of TVM's FuseOps plan) at
   each ``--per-task`` budget (4, 8, 16, 32), cumulatively in one log directory (tuning to 8 per task after 4 only
   adds the difference), compiled from the logs after each budget;
4. optionally (``--no-pretrained-row``) the same tuner without the pretrained model
   (MetaSchedule's XGBoost model from scratch), the ablation.

``--ms-from RUN_DIR`` skips re-tuning stock MetaSchedule (an hour and a half at 64 per
task on ppocr-cls here): the databases of an earlier run are applied with no new trial
and timed side by side with our rows again, and that run's tuning wall times reported.

A per-task budget ``b`` means ``b x n`` trials in all, where ``n`` is the number of
tuning tasks MetaSchedule extracts from the FuseOps module: the same total for both
tuners at the same ``b`` (our own task count on the same plan can differ slightly, as
FuseTIR and tvm-fusion's outlining do not group every elementwise tail alike; both counts
are reported). Every system's outputs are checked against ONNX Runtime (tolerance 1e-4),
then all are timed interleaved (``benchmarks.timing.interleave``), ONNX Runtime included
as a reference row. Writes ``results.json`` and ``RESULTS-pretrained.md`` to ``--out``.
See benchmarks/METHODS.md, section "Pretrained cost model against MetaSchedule".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import models as model_registry
from .systems import (Context, Row, called_kernels, prepare_metaschedule,
                      prepare_ort, run_system, short_reason, vm_runner)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_COST_MODEL = REPO / "tuning_logs" / "x86_zen4" / "costmodel.json"
DEFAULT_TARGET = "x86_zen4"  # the machine class the shipped model was trained on
TOL = 1e-4
WITHIN = 0.05  # "within 5% of MetaSchedule's result"
MD_NAME, JSON_NAME = "RESULTS-pretrained.md", "results.json"
COLUMNS = ("system", "trials per task", "total trials", "tuning wall s", "median ms",
           "p10-p90 ms", "x MetaSchedule-64", "max rel err", "status")

ORT_KEY, MS_KEY, MS_SAME_KEY = "onnxruntime", "metaschedule", "metaschedule-same-budget"
OURS_KEY, SCRATCH_KEY = "tvm-fusion-pretrained", "tvm-fusion-no-pretrained"


def _budgets(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def default_target() -> str:
    """``x86_zen4`` where its description ships (the cost model's hardware) and this
    machine can run its code (its CPU has every feature the description names: a Zen 2
    has no AVX-512, and an x86_zen4 kernel dies there of an illegal instruction), else
    ``host``."""
    from tvm_fusion import list_targets, load_target

    if DEFAULT_TARGET not in list_targets():
        return "host"
    try:
        flags = {f for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    except OSError:
        return "host"
    wanted = set(load_target(DEFAULT_TARGET).features)
    return DEFAULT_TARGET if wanted <= flags else "host"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.pretrained",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ppocr-cls",
                   help=f"one of {', '.join(model_registry.NAMES)} (default ppocr-cls, held "
                        "out of the shipped cost model's training data; 'embedded' was in "
                        "it: smoke runs only)")
    p.add_argument("--per-task", type=_budgets, default=[4, 8, 16, 32],
                   help="our budgets, trials per task, comma-separated (default 4,8,16,32); "
                        "tuned cumulatively in one log directory")
    p.add_argument("--ms-per-task", type=int, default=64,
                   help="stock MetaSchedule's trials per task (default 64)")
    p.add_argument("--ms-same-budget", action=argparse.BooleanOptionalAction, default=True,
                   help="also run stock MetaSchedule with the total budget of our smallest "
                        "per-task budget (default on)")
    p.add_argument("--ms-from", type=Path, default=None, metavar="RUN_DIR",
                   help="re-time stock MetaSchedule from the --out directory of an earlier "
                        "run of this benchmark (same model, target and --ms-per-task) "
                        "instead of tuning it again: its databases are copied and applied "
                        "with no new trial, and its tuning wall times are read from that "
                        "run's results.json. Use it to re-run our rows against the same "
                        "MetaSchedule result; the timing is still side by side")
    p.add_argument("--no-pretrained-row", action="store_true",
                   help="also run our tuner without the pretrained model at the same "
                        "budgets (the ablation)")
    p.add_argument("--cost-model", type=Path, default=DEFAULT_COST_MODEL,
                   help="the pretrained model (default: the shipped "
                        "tuning_logs/x86_zen4/costmodel.json)")
    p.add_argument("--target", default=None,
                   help="tvm-fusion target (default x86_zen4 where hw_targets/x86_zen4.json "
                        "exists, else host)")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default ~/.cache/tvm-fusion/benchmarks/"
                        "pretrained-<time>); tuning directories go under OUT/work/<model>/ "
                        "and are wiped at the start of a run")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--slot-ms", type=float, default=300.0,
                   help="time per system per round, ms")
    p.add_argument("--ms-builder-timeout", type=float, default=180.0,
                   help="LocalBuilder timeout for stock MetaSchedule, s (TVM's default, 30, "
                        "is shorter than its workers' start-up here: every build times out)")
    p.add_argument("--ms-population", type=int, default=None,
                   help="stock MetaSchedule's evolutionary search population (default "
                        "MetaSchedule's 512; the smoke tests use a small one)")
    args = p.parse_args(argv)
    if args.model not in model_registry.NAMES:
        p.error(f"unknown model {args.model!r}; known: {', '.join(model_registry.NAMES)}")
    if args.ms_per_task < 1:
        p.error("--ms-per-task must be at least 1")
    if args.ms_from is not None:
        args.ms_from = args.ms_from.expanduser().resolve()
        try:
            earlier = json.loads((args.ms_from / JSON_NAME).read_text())
        except (OSError, ValueError) as err:
            p.error(f"--ms-from {args.ms_from}: cannot read its {JSON_NAME} ({err}); give "
                    "the --out directory of an earlier `python -m benchmarks.pretrained` "
                    "run")
        settings = earlier.get("settings", {})
        for key in ("model", "ms_per_task"):
            if settings.get(key) != getattr(args, key):
                p.error(f"--ms-from {args.ms_from}: that run has {key} = "
                        f"{settings.get(key)!r}, this one {getattr(args, key)!r}")
        args.ms_earlier = earlier
    return args


# ---------------------------------------------------------------- the systems

def count_stock_tasks(model, hw) -> int:
    """Tuning tasks MetaSchedule extracts from the module ``static_shape_tuning`` tunes."""
    from .stock_ms import count_tasks

    return count_tasks(model.imported.mod, hw.tvm_target())


class OursSeries:
    """Our tuner at growing budgets in one log directory, one row per budget.

    ``tune()`` resumes a log directory up to its total trials, so each budget only adds
    the difference; the pretrained model object is the same across the calls, so it keeps
    learning from every measurement of the series (as one long run would). Without it,
    MetaSchedule's XGBoost model starts from nothing at every call.
    """

    def __init__(self, model, inputs, hw, logs: Path, n_tasks: int, cost_model):
        self.model, self.inputs, self.hw, self.logs = model, inputs, hw, logs
        self.n_tasks = n_tasks
        self.cost_model = cost_model
        self.tune_s = 0.0  # cumulative tuning wall time

    def prepare(self, per_task: int):
        def prepare(_ctx, row: Row):
            import tvm_fusion

            total = per_task * self.n_tasks
            t0 = time.monotonic()
            try:
                report = tvm_fusion.tune(self.model.imported, self.hw, trials=total,
                                         logs=self.logs,
                                         plan_options=tvm_fusion.PlanOptions(planner="fuseops"),
                                         search_options=tvm_fusion.SearchOptions(
                                             cost_model=self.cost_model),
                                         progress=sys.stderr.isatty())
            finally:
                self.tune_s += time.monotonic() - t0
            row.tune_s = self.tune_s
            t0 = time.monotonic()
            compiled = tvm_fusion.compile_model(self.model.imported, self.hw, logs=self.logs)
            row.compile_s = time.monotonic() - t0
            called = called_kernels(compiled.executable)
            untuned = set(compiled.untuned)
            row.kernels, row.untuned = len(called), sum(n in untuned for n in called)
            measured = sum(t.best_us is not None and not t.predicted for t in report.tasks)
            predicted = sum(t.predicted for t in report.tasks)
            row.extra.update(per_task=per_task, total_trials=report.trials_total,
                             own_tasks=len(report.tasks), measured_tasks=measured,
                             predicted_tasks=predicted, rejected=report.rejected,
                             interrupted=report.interrupted, logs=str(self.logs),
                             est_ms=report.est_ms)
            row.notes.append(
                f"{report.trials_total} trials over its {len(report.tasks)} tasks "
                f"({report.trials_total / max(len(report.tasks), 1):.1f} per own task); "
                f"{measured} with a measured record, {predicted} with the schedule the cost "
                f"model ranks best; {row.untuned}/{row.kernels} kernel calls untuned")
            return vm_runner(compiled.executable, self.inputs)
        return prepare


def ms_row(key: str, label: str, per_task: int | None, total: int, ctx: Context,
           earlier: dict | None = None, earlier_dir: Path | None = None) -> tuple:
    """A stock MetaSchedule row and its prepare function (``systems.prepare_metaschedule``;
    with ``earlier``, the results of an earlier run in ``earlier_dir``, its database is
    applied with no new trial)."""
    row = Row(key, label)
    row.extra.update(per_task=per_task, total_trials=total)
    if earlier is not None:
        return row, _reuse_ms(key, total, ctx, earlier, earlier_dir)

    def prepare(_ctx, r: Row):
        sub = Context(model=ctx.model, inputs=ctx.inputs, hw=ctx.hw, trials=total,
                      work=ctx.work / key, logs=None, ms_builder_timeout=ctx.ms_builder_timeout,
                      ms_per_task=per_task, ms_population=ctx.ms_population)
        return prepare_metaschedule(sub, r)

    return row, prepare


def _reuse_ms(key: str, total: int, ctx: Context, earlier: dict, earlier_dir: Path):
    """Prepare function re-building stock MetaSchedule's row ``key`` from an earlier run."""
    import shutil

    from .stock_ms import tune_and_build

    def prepare(_ctx, r: Row):
        old = next((x for x in earlier.get("rows", []) if x.get("key") == key), None)
        src = earlier_dir / "work" / ctx.model.name / key / "metaschedule"
        if old is None or not (src / "database_tuning_record.json").is_file():
            raise RuntimeError(f"--ms-from {earlier_dir}: no {key} row or database "
                               f"({src}) in that run")
        if old.get("extra", {}).get("total_trials") != total:
            raise RuntimeError(f"--ms-from {earlier_dir}: its {key} row tuned "
                               f"{old.get('extra', {}).get('total_trials')} trials, this "
                               f"run needs {total} (a different task count?)")
        dst = ctx.work / key / "metaschedule"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        # the setting it was tuned with: rows before prepack was recorded had none
        executable, facts = tune_and_build(ctx.model.imported.mod, ctx.hw.tvm_target(), dst,
                                           0, builder_timeout=ctx.ms_builder_timeout,
                                           per_task=old.get("extra", {}).get("per_task"),
                                           prepack=old.get("extra", {}).get("prepack", False))
        r.tune_s, r.compile_s = old.get("tune_s"), facts.pop("compile_s")
        facts.pop("tune_s")
        scheduled = facts.pop("scheduled")
        called = called_kernels(executable)
        r.kernels, r.untuned = len(called), sum(not scheduled.get(n, False) for n in called)
        r.extra.update(facts, reused_from=str(src), reused_created=earlier.get("created"))
        r.notes.extend(facts.get("notes", []))
        r.notes.append(f"tuned in an earlier run ({earlier.get('created')}, {src}); its "
                       "database applied here with no new trial, tuning wall time is that "
                       "run's")
        return vm_runner(executable, ctx.inputs)

    return prepare


def training_overlap(cost_model_path: Path, work: Path) -> dict:
    """How many of this run's tuning workloads the cost model was trained on.

    Workload keys are MetaSchedule's structural hashes, the keys the training sidecar
    lists (``train_workloads``); read from the databases this run wrote.
    """
    meta_path = Path(str(cost_model_path) + ".meta.json")
    try:
        seen = set(json.loads(meta_path.read_text()).get("train_workloads", []))
    except (OSError, ValueError):
        return {"note": f"cannot read {meta_path}"}
    out = {}
    for name, path in (("metaschedule", work / MS_KEY / "metaschedule"),
                       ("ours", work / OURS_KEY)):
        files = list(Path(path).rglob("database_workload.json")) if path.exists() else []
        keys = set()
        for f in files:
            for line in f.read_text().splitlines():
                try:
                    keys.add(str(json.loads(line)[0]))
                except (ValueError, IndexError):
                    continue
        if keys:
            out[name] = {"workloads": len(keys), "in_training_set": len(keys & seen)}
    return out


# ---------------------------------------------------------------- report

def _f(x, spec=".4f", none="n/a"):
    return none if x is None else format(x, spec)


def table_rows(rows: list[Row], ms_median: float | None) -> list[dict]:
    out = []
    for r in rows:
        st = r.stats()
        ok = r.status == "ok" and st
        ratio = st["median_ms"] / ms_median if ok and ms_median else None
        status = r.status if not r.reason else f"{r.status}: {r.reason}"
        out.append({
            "system": r.label,
            "trials per task": _f(r.extra.get("per_task"), "d", "-"),
            "total trials": _f(r.extra.get("total_trials"), "d", "-"),
            "tuning wall s": _f(r.tune_s, ".0f", "-"),
            "median ms": _f(st.get("median_ms")) if st else "n/a",
            "p10-p90 ms": f"{st['p10_ms']:.4f}-{st['p90_ms']:.4f}" if st else "n/a",
            "x MetaSchedule-64": _f(ratio, ".2f"),
            "max rel err": _f(r.max_err, ".1e"),
            "status": status.replace("|", "/"),
        })
    return out


def within_line(rows: list[Row], ms_row_: Row, key: str, budgets: list[int],
                ms_per_task: int, who: str) -> tuple[str, int | None]:
    """The "trials per task ours needs to come within 5%" line and its N (None: not reached)."""
    ms_st = ms_row_.stats()
    if ms_row_.status != "ok" or not ms_st:
        return (f"trials per task {who} needs to come within 5% of MetaSchedule's result: "
                f"unknown (the MetaSchedule-{ms_per_task} row is "
                f"{'not timed yet' if ms_row_.status == 'ok' else ms_row_.status})"), None
    goal = ms_st["median_ms"] * (1 + WITHIN)
    for r in rows:
        st = r.stats()
        if r.key == key and r.status == "ok" and st and st["median_ms"] <= goal:
            n = r.extra["per_task"]
            return (f"trials per task {who} needs to come within 5% of MetaSchedule's "
                    f"result: {n} ({st['median_ms']:.4f} ms against "
                    f"{ms_st['median_ms']:.4f} ms at {ms_per_task} per task)"), n
    return (f"trials per task {who} needs to come within 5% of MetaSchedule's result: "
            f"not reached at {max(budgets)}"), None


def render_md(results: dict) -> str:
    s = results["settings"]
    lines = [f"# Pretrained cost model against stock MetaSchedule: {s['model']}", "",
             f"- created {results['created']}; command `{results['command']}`",
             f"- target `{s['target']}` ({json.dumps(results['machine']['target'])}); "
             f"{results['machine']['cpu']}, {results['machine']['cores']} cores; load "
             f"average {results['machine']['loadavg_start']} at start, "
             f"{results['machine'].get('loadavg_end')} at end",
             f"- cost model `{s['cost_model']}`"
             + (f" (held-out metrics: {results['cost_model_holdout']})"
                if results.get("cost_model_holdout") else ""),
             f"- tuning tasks: {s['n_tasks']} (MetaSchedule's, the unit of every per-task "
             f"budget); ours on the same FuseOps plan: {results.get('own_tasks', 'n/a')}",
             f"- training-set overlap of this run's kernels: "
             f"{json.dumps(results.get('training_overlap', {}))}",
             f"- tolerance {TOL:g} against ONNX Runtime; timing {s['rounds']} interleaved "
             f"rounds x {s['slot_ms']:.0f} ms", ""]
    if results.get("warnings"):
        lines += [f"- **{w}**" for w in results["warnings"]] + [""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for t in results["table"]:
        lines.append("| " + " | ".join(t[c] for c in COLUMNS) + " |")
    lines += [""] + [f"**{x}**" for x in results["summary"]] + ["", "## Notes per row", ""]
    for r in results["rows"]:
        if r["notes"]:
            lines.append(f"- {r['label']}: " + "; ".join(r["notes"]))
    lines += ["", "## Method", "", METHOD]
    return "\n".join(lines) + "\n"


METHOD = """\
- One model, one process. Stock MetaSchedule is TVM's `static_shape_tuning` pipeline
  (FuseOps, FuseTIR, MetaScheduleTuneIRMod, MetaScheduleApplyDatabase) then
  `relax.build`, with `total_trials = per-task budget x tasks` (`benchmarks.stock_ms`);
  its only change from stock is the LocalBuilder timeout (see benchmarks/METHODS.md).
- Ours: `tvm_fusion.tune(model, target, trials=b x tasks, logs=DIR,
  plan_options=PlanOptions(planner="fuseops"), search_options=SearchOptions(
  cost_model=MODEL))` for each b, cumulatively in one log directory (each budget adds
  only the difference; tuning wall time is cumulative), then `compile_model(model, target,
  logs=DIR)` after each budget. One pretrained model object serves the whole series, so
  it keeps learning from every measurement, as one long run would.
- Per-task budgets count MetaSchedule's tuning tasks of the FuseOps module for both
  tuners, so equal per-task budgets are equal total budgets.
- Outputs: max over outputs of max|got - want| / max|want| against ONNX Runtime; a row
  over the tolerance is WRONG and not ranked. Latency: median over all calls of all
  interleaved rounds, p10-p90 the spread; "x MetaSchedule-64" is the row's median over
  that of the stock MetaSchedule row at `--ms-per-task` (64 unless a smoke run says
  otherwise), from the same run.
- A row's tuning wall time and budget are filled as soon as it is built, and both files
  are rewritten after every row, so a run that stops keeps what it finished (untimed).
"""


def write_all(results: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / JSON_NAME, "md": out / MD_NAME}
    paths["json"].write_text(json.dumps(results, indent=1, default=str))
    paths["md"].write_text(render_md(results))
    return paths


def finish(results: dict, rows: list[Row], ms_main: Row, args, n_tasks: int,
           cost_model_path: Path, work: Path, out: Path) -> dict[str, Path]:
    """Fill the summary, table and rows of ``results`` and write both files.

    Called after every prepared row too (untimed then), so that a long run that stops
    keeps what it finished.
    """
    budgets = args.per_task
    ms_median = ms_main.stats().get("median_ms") if ms_main.status == "ok" else None
    summary = []
    line, n_needed = within_line(rows, ms_main, OURS_KEY, budgets, args.ms_per_task, "ours")
    summary.append(line)
    if args.no_pretrained_row:
        summary.append(within_line(rows, ms_main, SCRATCH_KEY, budgets, args.ms_per_task,
                                   "ours without the pretrained model")[0])
    same_row = next((r for r in rows if r.key == MS_SAME_KEY), None)
    first = next((r for r in rows if r.key == OURS_KEY), None)
    if same_row is not None and first is not None:
        a, b = first.stats(), same_row.stats()
        if first.status == "ok" and same_row.status == "ok" and a and b:
            summary.append(f"at the same total budget ({budgets[0] * n_tasks} trials): ours "
                           f"{a['median_ms']:.4f} ms, MetaSchedule {b['median_ms']:.4f} ms "
                           f"(MetaSchedule / ours = {b['median_ms'] / a['median_ms']:.2f})")
    results.update(
        own_tasks=next((r.extra.get("own_tasks") for r in rows if r.key == OURS_KEY
                        and r.extra.get("own_tasks") is not None), None),
        training_overlap=training_overlap(cost_model_path, work),
        within_5pct_per_task=n_needed, summary=summary,
        table=table_rows(rows, ms_median), rows=[r.to_json() for r in rows])
    results["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return write_all(results, out)


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from .run import _cpu_name, _log_factory

    log = _log_factory()
    cost_model_path = args.cost_model.resolve()
    if not cost_model_path.is_file():
        print(f"error: the pretrained cost model {cost_model_path} does not exist. This "
              "benchmark compares tuning with it against stock MetaSchedule; train one with "
              "`tvm-fusion cost-model train --logs DIR... --target x86_zen4 -o "
              f"{cost_model_path}` or pass --cost-model PATH.", file=sys.stderr)
        return 2
    out = (args.out or (Path.home() / ".cache" / "tvm-fusion" / "benchmarks"
                        / time.strftime("pretrained-%Y%m%d-%H%M%S"))).resolve()
    log(f"output: {out}")

    import tvm_fusion
    from tvm_fusion import load_target
    from tvm_fusion.costmodel import make_cost_model
    from tvm_fusion.errors import TvmFusionError
    from tvm_fusion.compat.fast_import import import_tensor_intrinsics

    from .systems import _fresh
    from .timing import interleave

    import_tensor_intrinsics()  # 25 s -> 3 s in this process
    hw = load_target(args.target or default_target())
    warnings = []
    if args.target is None and hw.name != "host":
        host = load_target("host")
        if dict(host.tvm_config) != dict(hw.tvm_config):
            warnings.append(f"this machine ({dict(host.tvm_config)}) is not {hw.name} "
                            f"({dict(hw.tvm_config)}): kernels are tuned for {hw.name}'s "
                            "target; pass --target host to tune for this machine")
    try:  # load (and fail) before any tuning; the same object serves the whole series
        cost_model = make_cost_model(cost_model_path, hw)
    except TvmFusionError as err:
        print(f"error: cannot use the cost model {cost_model_path}: {err}", file=sys.stderr)
        return 2
    holdout = cost_model.model.meta.get("metrics", {}).get("holdout")
    if args.model == model_registry.EMBEDDED:
        warnings.append("the embedded model is in the shipped cost model's training data: "
                        "this is a smoke run, not the held-out benchmark")
    log(f"target {hw.name}: {dict(hw.tvm_config)}; cost model {cost_model_path}")

    log(f"{args.model}: importing")
    model = model_registry.load(args.model)
    inputs = model.inputs()
    n_tasks = count_stock_tasks(model, hw)
    budgets = args.per_task
    log(f"{args.model}: {n_tasks} MetaSchedule tuning tasks; MetaSchedule "
        f"{args.ms_per_task} x {n_tasks} = {args.ms_per_task * n_tasks} trials; ours "
        + ", ".join(f"{b} x {n_tasks} = {b * n_tasks}" for b in budgets))
    work = out / "work" / args.model
    ctx = Context(model=model, inputs=inputs, hw=hw, trials=0, work=work, logs=None,
                  ms_builder_timeout=args.ms_builder_timeout, ms_population=args.ms_population)

    results = {
        "schema": "tvm-fusion/benchmarks-pretrained", "version": 1,
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python -m benchmarks.pretrained " + " ".join(argv),
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(),
                    "target": dict(hw.tvm_config),
                    "loadavg_start": [round(x, 2) for x in os.getloadavg()],
                    "versions": {"tvm-fusion": tvm_fusion.__version__}},
        "settings": {"model": args.model, "target": hw.name, "per_task": budgets,
                     "ms_from": str(args.ms_from) if args.ms_from else None,
                     "ms_per_task": args.ms_per_task, "ms_same_budget": args.ms_same_budget,
                     "no_pretrained_row": args.no_pretrained_row,
                     "cost_model": str(cost_model_path), "n_tasks": n_tasks,
                     "rounds": args.rounds, "slot_ms": args.slot_ms,
                     "ms_builder_timeout": args.ms_builder_timeout,
                     "ms_population": args.ms_population, "tolerance": TOL},
        "cost_model_holdout": holdout, "warnings": warnings,
    }

    # ONNX Runtime first: its outputs are the reference for every other system.
    ort_row = Row(ORT_KEY, "ONNX Runtime (CPU EP, reference)")
    ref = None
    try:
        call, outputs = prepare_ort(ctx, ort_row)
        ref = outputs()
        ort_row.status, ort_row.max_err, ort_row.call = "ok", 0.0, call
        log(f"  [{ORT_KEY}] ok (reference)")
    except Exception as err:  # noqa: BLE001 - without it nothing can be checked
        ort_row.status, ort_row.reason = "failed", short_reason(err)
        log(f"  [{ORT_KEY}] failed: {ort_row.reason}; outputs cannot be checked")
    rows = [ort_row]

    plan = []  # (row, prepare) in run order
    ms_total = args.ms_per_task * n_tasks
    earlier = getattr(args, "ms_earlier", None)
    ms_main, prep = ms_row(MS_KEY, f"MetaSchedule ({args.ms_per_task}/task)",
                           args.ms_per_task, ms_total, ctx, earlier, args.ms_from)
    plan.append((ms_main, prep))
    if args.ms_same_budget:
        same = budgets[0] * n_tasks
        plan.append(ms_row(MS_SAME_KEY, f"MetaSchedule (same total as ours at "
                                        f"{budgets[0]}/task)", None, same, ctx, earlier,
                           args.ms_from))
    series = [(OURS_KEY, "tvm-fusion + pretrained model", cost_model)]
    if args.no_pretrained_row:
        series.append((SCRATCH_KEY, "tvm-fusion, no pretrained model", "none"))
    for key, label, cm in series:
        s = OursSeries(model, inputs, hw, _fresh(work / key), n_tasks, cm)
        for b in budgets:
            row = Row(key, f"{label} ({b}/task)")
            plan.append((row, s.prepare(b)))
    status = 0
    try:
        for row, prep in plan:
            run_system(prep, None, row, ref, TOL, log=log)
            rows.append(row)
            finish(results, rows, ms_main, args, n_tasks, cost_model_path, work, out)
            if row.extra.get("interrupted"):  # tune() stopped on Ctrl-C: time what is done
                log("interrupted: timing what is finished")
                status = 130
                break
    except KeyboardInterrupt:
        log("interrupted: timing what is finished")
        status = 130

    log(f"timing {sum(r.call is not None for r in rows)} systems, {args.rounds} rounds x "
        f"{args.slot_ms:.0f} ms")
    interleave(rows, rounds=args.rounds, slot_s=args.slot_ms / 1e3, log=log)
    for r in rows:
        r.call = None

    paths = finish(results, rows, ms_main, args, n_tasks, cost_model_path, work, out)
    widths = [max(len(c), *(len(t[c]) for t in results["table"])) for c in COLUMNS[:-1]]
    print()
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS[:-1], widths)) + "  status")
    for t in results["table"]:
        print("  ".join(t[c].ljust(w) for c, w in zip(COLUMNS[:-1], widths)) + "  "
              + t["status"][:80])
    print()
    for x in warnings + results["summary"]:
        print(x)
    log("wrote " + ", ".join(str(p) for p in paths.values()))
    return status


if __name__ == "__main__":
    sys.exit(main())
