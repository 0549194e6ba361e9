"""The systems compared, one ``prepare_*`` function each.

A prepare function builds (and, where it tunes, tunes) its system for one model, fills
the build facts of its :class:`Row` (tuning and compile seconds, kernels, notes) and
returns ``(call, outputs)``: ``call()`` runs one inference on the benchmark inputs
(what the timing loop times), ``outputs()`` runs one and returns numpy arrays in the
model's output order (what the correctness check compares with ONNX Runtime).

:func:`run_system` wraps each: an exception becomes ``failed: <reason>`` in the table
and the run goes on.
"""

from __future__ import annotations

import shutil
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .models import BenchModel

ORT, TORCH, PLAIN, MS, FUSEOPS_PLAN, FUSION, FROM_LOGS = (
    "onnxruntime", "pytorch", "tvm-unscheduled", "metaschedule", "tvm-fusion-fuseops-plan",
    "tvm-fusion", "tvm-fusion-from-logs")
KEYS = (ORT, TORCH, PLAIN, MS, FUSEOPS_PLAN, FUSION, FROM_LOGS)
# Run by default: the FuseOps-plan row is the planner ablation (``--systems`` adds it).
DEFAULT_KEYS = (ORT, TORCH, PLAIN, MS, FUSION, FROM_LOGS)


def labels(trials: int) -> dict[str, str]:
    return {
        ORT: "ONNX Runtime (CPU EP)",
        TORCH: "PyTorch eager (onnx2torch)",
        PLAIN: "TVM unscheduled",
        MS: f"TVM FuseOps + MetaSchedule ({trials} trials)",
        FUSEOPS_PLAN: f"tvm-fusion tuner on FuseOps' plan ({trials} trials)",
        FUSION: f"tvm-fusion ({trials} trials)",
        FROM_LOGS: "tvm-fusion from logs (no tuning)",
    }


class Unavailable(Exception):
    """The system cannot run here at all (a missing package), as opposed to failing."""


@dataclass
class Row:
    """One system's result on one model."""

    key: str
    label: str
    status: str = "pending"  # ok | wrong | failed | unavailable | skipped | untimed | unchecked
    reason: str = ""
    tune_s: float | None = None
    compile_s: float | None = None
    kernels: int | None = None       # kernel calls per inference; None: not applicable
    untuned: int | None = None       # of those, how many kept their default schedule
    max_err: float | None = None
    times_ms: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    call: Callable | None = field(default=None, repr=False)
    # what names the cause of a wrong output (a note), where the system can tell
    explain: Callable[[], str] | None = field(default=None, repr=False)

    @property
    def timed(self) -> bool:
        return bool(self.times_ms)

    def stats(self) -> dict:
        if not self.times_ms:
            return {}
        t = np.asarray(self.times_ms)
        return {"median_ms": float(np.median(t)), "p10_ms": float(np.percentile(t, 10)),
                "p90_ms": float(np.percentile(t, 90)), "calls": int(t.size)}

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in ("key", "label", "status", "reason", "tune_s",
                                             "compile_s", "kernels", "untuned", "max_err",
                                             "notes", "extra")}
        out.update(self.stats())
        return out


@dataclass
class Context:
    """What every prepare function gets for one model."""

    model: BenchModel
    inputs: list[np.ndarray]
    hw: object                       # tvm_fusion.HardwareTarget
    trials: int
    work: Path                       # OUT/work/<model>: tuning directories of this run
    logs: Path | None                # --logs: shipped tvm-fusion logs
    ms_builder_timeout: float | None
    fusion_logs: Path | None = None  # set by the tvm-fusion row
    resume: bool = False             # --resume: keep tvm-fusion logs of an earlier run
    ms_per_task: int | None = None   # stock MetaSchedule's max_trials_per_task (default:
                                     # an even share of ``trials`` over its tasks)
    ms_population: int | None = None  # stock MetaSchedule's search population (default 512)
    ms_resume: bool = False          # --ms-resume: apply stock MetaSchedule's earlier database


def short_reason(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = lines[-1] if lines else ""
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def max_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest ``max_rel_error`` over all outputs; inf when the output counts differ."""
    from tvm_fusion.reference import max_rel_error

    if len(got) != len(want):
        return float("inf")
    return max((max_rel_error(g, w) for g, w in zip(got, want)), default=0.0)


def run_system(prepare, ctx: Context, row: Row, ref: list[np.ndarray] | None,
               tol: float, log=print) -> None:
    """Prepare one system, check its outputs, and leave ``row.call`` set if it may be timed."""
    t0 = time.monotonic()
    log(f"  [{row.key}] preparing ...")
    try:
        call, outputs = prepare(ctx, row)
    except Unavailable as err:
        row.status, row.reason = "unavailable", str(err)
        log(f"  [{row.key}] unavailable: {err}")
        return
    except Exception as err:  # noqa: BLE001 - a failing system is a table entry
        row.status, row.reason = "failed", short_reason(err)
        row.extra["traceback"] = traceback.format_exc()[-6000:]
        log(f"  [{row.key}] failed after {time.monotonic() - t0:.1f} s: {row.reason}")
        return
    try:
        got = outputs()
    except Exception as err:  # noqa: BLE001
        row.status, row.reason = "failed", "running it failed: " + short_reason(err)
        row.extra["traceback"] = traceback.format_exc()[-6000:]
        log(f"  [{row.key}] {row.reason}")
        return
    if ref is None:
        row.status = "unchecked"
    else:
        row.max_err = max_error(got, ref)
        row.status = "ok" if row.max_err <= tol else "wrong"
        if row.status == "wrong" and row.explain is not None:
            log(f"  [{row.key}] wrong output: looking for the kernels that make it so ...")
            try:
                row.notes.append(row.explain())
            except Exception as err:  # noqa: BLE001 - the row is wrong either way
                row.notes.append("could not tell which kernel is wrong: " + short_reason(err))
    if row.extra.get("timed") is False:
        row.status = "untimed" if row.status == "ok" else row.status
    else:
        row.call = call
    err = "n/a" if row.max_err is None else f"{row.max_err:.2e}"
    log(f"  [{row.key}] {row.status} in {time.monotonic() - t0:.1f} s (max rel err {err})")


# ---------------------------------------------------------------- ONNX Runtime

def prepare_ort(ctx: Context, row: Row, *, optimize: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.log_severity_level = 3
    t0 = time.monotonic()
    sess = ort.InferenceSession(ctx.model.original.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    row.compile_s = time.monotonic() - t0
    feed = {info.name: a for info, a in zip(ctx.model.imported.inputs, ctx.inputs)}
    row.notes.append(f"onnxruntime {ort.__version__}, default threads, "
                     f"{'all graph optimizations' if optimize else 'optimizations off'}")

    def call():
        return sess.run(None, feed)

    return call, lambda: [np.asarray(o) for o in call()]


# ---------------------------------------------------------------- PyTorch

def _import_onnx2torch(row: Row):
    try:
        import torchvision  # noqa: F401
    except Exception as err:  # noqa: BLE001 - ImportError, or a CUDA-only wheel failing
        # onnx2torch imports torchvision for its NMS and RoiAlign converters only. The
        # torchvision wheels on PyPI are built against CUDA torch and cannot load with
        # the CPU build; a stub lets every other converter load.
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        stub, ops = types.ModuleType("torchvision"), types.ModuleType("torchvision.ops")

        def missing(*_a, **_k):
            raise RuntimeError("torchvision is not available (stubbed by the harness)")

        ops.nms = ops.roi_align = ops.box_convert = missing
        stub.ops = ops
        sys.modules["torchvision"], sys.modules["torchvision.ops"] = stub, ops
        row.notes.append(f"torchvision stubbed ({type(err).__name__}): NMS/RoiAlign "
                         "models would not convert")
    try:
        import onnx2torch
    except ImportError as err:
        raise Unavailable(f"onnx2torch is not installed ({err}); `pip install --no-deps "
                          "onnx2torch`") from err
    return onnx2torch


def _flatten_torch(out) -> list:
    if isinstance(out, (list, tuple)):
        return [a for o in out for a in _flatten_torch(o)]
    if isinstance(out, dict):
        return [a for o in out.values() for a in _flatten_torch(o)]
    return [out]


def prepare_pytorch(ctx: Context, row: Row):
    try:
        import torch
    except ImportError as err:
        raise Unavailable(f"torch is not installed ({err}); `pip install torch==2.13.0` "
                          "(the CPU build)") from err
    onnx2torch = _import_onnx2torch(row)
    t0 = time.monotonic()
    attempts = []
    module = None
    for label, proto in (("the model as shipped", ctx.model.original),
                         ("the shape-fixed, folded model", ctx.model.imported.onnx_model)):
        try:
            module = onnx2torch.convert(proto).eval()
            row.extra["converted"] = label
            break
        except Exception as err:  # noqa: BLE001 - each reason goes to the table
            attempts.append(f"{label}: {short_reason(err)}")
    if module is None:
        raise RuntimeError("onnx2torch does not convert it: " + "; ".join(attempts))
    row.compile_s = time.monotonic() - t0
    if attempts:
        row.notes.append("converted from the shape-fixed, folded model (" + attempts[0] + ")")
    row.notes.append(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    tensors = [torch.from_numpy(np.array(a)) for a in ctx.inputs]

    def call():
        with torch.inference_mode():
            return module(*tensors)

    def outputs():
        return [t.detach().numpy() if hasattr(t, "detach") else np.asarray(t)
                for t in _flatten_torch(call())]

    return call, outputs


# ---------------------------------------------------------------- TVM

def _flatten_tvm(result) -> list:
    import tvm

    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    return [t for r in result for t in _flatten_tvm(r)]


def vm_runner(executable, inputs):
    """``(call, outputs)`` of a Relax VM executable on fixed inputs."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    # np.require keeps 0-d inputs 0-d (np.ascontiguousarray would make them 1-d).
    args = [tvm.runtime.tensor(np.require(a, requirements='C'), dev) for a in inputs]
    main = vm["main"]

    def call():
        return main(*args)

    return call, lambda: [t.numpy() for t in _flatten_tvm(call())]


def called_kernels(executable) -> list[str]:
    """Names of the compiled PrimFuncs the VM calls, once per call site."""
    lib = executable.mod
    names = []
    for line in executable.as_text().splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] != "call" or parts[1].startswith("vm."):
            continue
        try:
            if lib.implements_function(parts[1], True):
                names.append(parts[1])
        except Exception:  # noqa: BLE001 - older runtimes: fall back to the name
            if "." not in parts[1]:
                names.append(parts[1])
    return names


def prepare_plain(ctx: Context, row: Row):
    import tvm_fusion

    t0 = time.monotonic()
    compiled = tvm_fusion.compile_model(ctx.model.imported, ctx.hw, logs=None)
    row.compile_s = time.monotonic() - t0
    called = called_kernels(compiled.executable)
    row.kernels, row.untuned = len(called), len(called)
    row.notes.append("tvm-fusion's default plan, every kernel its default schedule")
    return vm_runner(compiled.executable, ctx.inputs)


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def prepare_fusion(ctx: Context, row: Row, *, planner: str = "cost"):
    import tvm_fusion

    logs = ctx.work / f"tvm-fusion-logs-{planner}"
    if ctx.resume and logs.is_dir():
        # tune() resumes up to the total budget: a finished run tunes nothing more.
        row.notes.append(f"resumed from {logs}: tuning time is this run's only")
    else:
        _fresh(logs)
    t0 = time.monotonic()
    if planner == "cost":
        ctx.fusion_logs = logs
    report = tvm_fusion.tune(ctx.model.imported, ctx.hw, trials=ctx.trials, logs=logs,
                             plan_options=tvm_fusion.PlanOptions(planner=planner))
    row.tune_s = time.monotonic() - t0
    t0 = time.monotonic()
    compiled = tvm_fusion.compile_model(ctx.model.imported, ctx.hw, logs=logs)
    row.compile_s = time.monotonic() - t0
    called = called_kernels(compiled.executable)
    untuned = set(compiled.untuned)
    row.kernels, row.untuned = len(called), sum(n in untuned for n in called)
    have = sum(t.best_us is not None for t in report.tasks)
    row.notes.append(f"{planner} plan: {len(compiled.plan.groups)} fused groups; "
                     f"{report.trials_total} trials; {have}/{len(report.tasks)} tuning tasks "
                     f"have a verified record; {report.rejected} candidates rejected by "
                     f"verification; cost model: {report.cost_model}")
    row.extra.update(logs=str(logs), trials_total=report.trials_total,
                     cost_model=report.cost_model, est_ms=report.est_ms, rejected=report.rejected,
                     tasks=[{"name": t.name, "weight": t.weight, "trials": t.trials,
                             "best_us": t.best_us} for t in report.tasks])
    return vm_runner(compiled.executable, ctx.inputs)


def prepare_from_logs(ctx: Context, row: Row):
    import json

    import tvm_fusion

    logs = ctx.logs or ctx.fusion_logs
    if logs is None:
        raise RuntimeError("no logs: --logs was not given and the tvm-fusion row made none")
    manifest = Path(logs) / ctx.hw.name / "manifest.json"
    models = json.loads(manifest.read_text()).get("models", {}) if manifest.is_file() else {}
    if ctx.model.imported.model_hash not in models:
        row.notes.append(f"{manifest} has no plan or records for this model: every kernel "
                         "keeps its default schedule")
    t0 = time.monotonic()
    compiled = tvm_fusion.compile_model(ctx.model.imported, ctx.hw, logs=logs)
    row.compile_s = time.monotonic() - t0
    row.tune_s = 0.0
    called = called_kernels(compiled.executable)
    untuned = set(compiled.untuned)
    row.kernels, row.untuned = len(called), sum(n in untuned for n in called)
    row.extra["logs"] = str(logs)
    if ctx.logs is None:
        # The same logs as the tvm-fusion row, so the same kernels: only the compile
        # time (and the outputs) are new; timing it again would repeat that row.
        row.extra["timed"] = False
        row.notes.append("compiled from the logs the tvm-fusion row just wrote: compile "
                         "time and outputs only, latency is that row's")
    return vm_runner(compiled.executable, ctx.inputs)


def prepare_metaschedule(ctx: Context, row: Row):
    from .stock_ms import tune_and_build

    work = ctx.work / "metaschedule"
    resumed = ctx.ms_resume and (work / "database_tuning_record.json").is_file()
    if ctx.ms_resume and not resumed:
        row.notes.append(f"--ms-resume: no database in {work}, so MetaSchedule tuned afresh")
    executable, facts = tune_and_build(ctx.model.imported.mod, ctx.hw.tvm_target(),
                                       work if resumed else _fresh(work),
                                       0 if resumed else ctx.trials,
                                       builder_timeout=ctx.ms_builder_timeout,
                                       per_task=ctx.ms_per_task,
                                       population=ctx.ms_population)
    if resumed:  # the same schedules, so the same kernels: only the timing is new
        facts.pop("total_trials", None)
        row.notes.append(f"applied the database of an earlier run in {work} (no tuning): "
                         "its tuning time is that run's")
    row.tune_s, row.compile_s = facts.pop("tune_s"), facts.pop("compile_s")
    scheduled = facts.pop("scheduled")
    called = called_kernels(executable)
    row.kernels = len(called)
    row.untuned = sum(not scheduled.get(n, False) for n in called)
    row.extra.update(facts)
    row.notes.extend(facts.get("notes", []))
    row.explain = lambda: explain_wrong(work, ctx.hw.tvm_target())
    return vm_runner(executable, ctx.inputs)


def explain_wrong(work: Path, target) -> str:
    """A note naming stock MetaSchedule's wrong kernels (it verifies no candidate)."""
    from .stock_ms import wrong_kernels

    wrong = wrong_kernels(work, target)
    if not wrong:
        return ("every tuned kernel matches its unscheduled version alone: the error comes "
                "from elsewhere (the graph passes or the build)")
    parts = [f"{'+'.join(w['blocks'])} (max rel err {w['max_rel_err']:.2g}, "
             f"{w['run_us']:.0f} us; {w['correct_records']} of its other "
             f"{w['records'] - 1} records are right)" for w in wrong]
    return (f"{len(wrong)} tuned kernel(s) wrong on their own, as MetaSchedule verifies "
            "nothing it measures: " + "; ".join(parts))


def prepare_fuseops_plan(ctx: Context, row: Row):
    """The planner ablation: our tuner and budget, TVM FuseOps' grouping."""
    return prepare_fusion(ctx, row, planner="fuseops")


PREPARE = {ORT: prepare_ort, TORCH: prepare_pytorch, PLAIN: prepare_plain,
           MS: prepare_metaschedule, FUSEOPS_PLAN: prepare_fuseops_plan,
           FUSION: prepare_fusion, FROM_LOGS: prepare_from_logs}
