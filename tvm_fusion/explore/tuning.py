"""Notebook views of tuning logs: per-kernel results, tuning curves, a roofline chart.

Everything is read from a log directory (``LOGS/<target>/``) and the model it was tuned
for: the manifest gives the plan that was tuned, re-applying it gives the kernels (the
tuning tasks), and the databases give what was measured. Lines that do not parse are
skipped here (``tvm-fusion logs validate`` is the tool that reports them).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from .. import config
from ..kernels import KernelOptions, prepare_kernels
from ..targets import as_target
from ..tune.builder import PooledBuilder
from ..compat.fast_import import import_tensor_intrinsics
from ..compat.fast_math import vectorizable_exp
from ..logs.logdb import is_measured, read_run_times
from ..compat.ms_compat import drop_unnamed_handlers, plain_task_tables

# matplotlib (about 1 s to import) is imported by the functions that draw, so that
# importing tvm_fusion.explore for its tables does not load it.


@dataclass(frozen=True, kw_only=True)
class KernelResult:
    """One tuning task (one fused kernel) and what its log holds.

    Attributes
    ----------
    name : str
        Task (kernel) name.
    weight : int
        Calls per inference.
    flops : float
        Arithmetic operations per call (from TIR).
    bytes : int
        Bytes of its arguments, each read or written once: its DRAM traffic when
        everything else stays on chip.
    best_us : float or None
        Best verified latency per call (median of its runs); None when the log has no
        record for it.
    measured : int
        Candidates measured for it.
    """

    name: str
    weight: int
    flops: float
    bytes: int
    best_us: float | None
    measured: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte of DRAM traffic."""
        return self.flops / max(self.bytes, 1)

    @property
    def gflops(self) -> float | None:
        """Achieved GFLOP/s of the best record."""
        return None if not self.best_us else self.flops / self.best_us / 1e3


@dataclass(frozen=True, kw_only=True)
class TuningCurve:
    """Estimated model latency after each trial: sum over kernels of best so far x calls.

    A tuner measures kernels in turn, so early on most have no measurement. A kernel
    not measured yet counts with its default schedule's latency, timed here (``baseline``
    True, the default; the curve starts at the untuned model), else with its first
    measurement. ``complete[i]`` is False while some kernel was not yet measured;
    ``unmeasured`` kernels never were (with no baseline they are left out of the sum).
    """

    label: str
    trials: tuple[int, ...]
    est_ms: tuple[float, ...]
    complete: tuple[bool, ...]
    tasks: int
    unmeasured: int = 0
    baseline: bool = False


def curve_from_records(db_dir: str | Path, weights: dict[str, int], label: str,
                       default_us: dict[str, float] | None = None) -> TuningCurve:
    """The curve of a MetaSchedule database whose tasks have ``weights`` (hash -> calls).

    ``default_us`` (hash -> default-schedule latency) gives not-yet-measured kernels
    their untuned time; without it they count with their first measurement.
    """
    hashes, records = read_run_times(db_dir)
    runs = []
    for idx, secs in records:
        h = hashes[idx] if 0 <= idx < len(hashes) else None
        runs.append((h, statistics.median(secs)) if h in weights and is_measured(secs) else None)
    if default_us:
        start = {h: default_us[h] * 1e-6 for h in weights if h in default_us}
    else:
        start = {}
        for run in runs:
            if run is not None:
                start.setdefault(*run)
    measured = {run[0] for run in runs if run is not None}
    best = dict(start)
    seen: set[str] = set()
    trials, est, complete = [], [], []
    for i, run in enumerate(runs, start=1):
        if run is not None:
            h, lat = run
            best[h] = min(best[h], lat) if h in seen else lat
            seen.add(h)
        if best:
            trials.append(i)
            est.append(sum(best[k] * weights[k] for k in best) * 1e3)
            complete.append(len(seen) == len(measured))
    return TuningCurve(label=label, trials=tuple(trials), est_ms=tuple(est),
                       complete=tuple(complete), tasks=len(weights),
                       unmeasured=len(weights) - len(measured), baseline=bool(default_us))


def default_latencies(tasks, target) -> dict[str, float]:
    """Structural hash -> latency (us) of each task's kernel with no schedule at all.

    What a kernel costs before tuning touches it: built as it comes out of lowering,
    timed with TVM's time evaluator (median of 5 repeats of at least 10 ms), on every
    core (:func:`tvm_fusion.config.use_all_cores`, as the tuner times its kernels).
    """
    config.use_all_cores()
    dev = tvm.cpu()
    out = {}
    for t in tasks:
        mod = t.dispatched[0]
        func = mod[mod.get_global_vars()[0]]
        with vectorizable_exp():  # as the tuner's builder
            lib = tvm.tirx.build(mod, target=target)
        args = [tvm.runtime.tensor(np.zeros([int(d) for d in b.shape], dtype=str(b.dtype)), dev)
                for b in func.params]
        timer = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=5, min_repeat_ms=10)
        out[str(tvm_ffi.structural_hash(mod))] = float(np.median(timer(*args).results)) * 1e6
    return out


def _tuned_tasks(model, target, logs):
    """(hardware target, target dir, manifest entry, tuning tasks) of a tuned model:
    the stored plan's kernels, as tuned."""
    # any manifest is read as it is (these views only read timings); logs tuned before
    # graph simplification are the unsimplified graph's, without a warning
    kernels = prepare_kernels(model, target, logs, KernelOptions(
        check_logs=False, require_entry=True, before_simplify="quiet"))
    return kernels.hw, kernels.tdir, kernels.entry, kernels.tasks


def _weights(tasks) -> dict[str, int]:
    return {str(tvm_ffi.structural_hash(t.dispatched[0])): int(t.weight) for t in tasks}


def kernel_results(model, target, logs) -> list[KernelResult]:
    """Every kernel of a tuned model with its FLOPs, bytes and best verified latency.

    Parameters
    ----------
    model : ImportedModel
        The model as tuned (same input shapes).
    target : str or HardwareTarget
    logs : path
        The log directory given to :func:`tvm_fusion.tune`.
    """
    _, tdir, _, tasks = _tuned_tasks(model, target, logs)
    best: dict[str, float] = {}
    hashes, records = read_run_times(tdir)
    for idx, secs in records:
        if 0 <= idx < len(hashes) and is_measured(secs):
            h = hashes[idx]
            best[h] = min(best.get(h, math.inf), statistics.median(secs))
    measured: dict[str, int] = {}
    hashes, records = read_run_times(tdir / "candidates")
    for idx, _ in records:
        if 0 <= idx < len(hashes):
            measured[hashes[idx]] = measured.get(hashes[idx], 0) + 1
    out = []
    for t in tasks:
        mod = t.dispatched[0]
        h = str(tvm_ffi.structural_hash(mod))
        func = mod[mod.get_global_vars()[0]]
        nbytes = sum(math.prod(int(d) for d in b.shape) * b.dtype.bits // 8
                     for b in func.params if hasattr(b, "shape"))
        out.append(KernelResult(name=t.task_name, weight=int(t.weight),
                                flops=float(estimate_tir_flops(mod)), bytes=int(nbytes),
                                best_us=best[h] * 1e6 if h in best else None,
                                measured=measured.get(h, 0)))
    return out


def tuning_curve(model, target, logs, *, label: str = "tvm-fusion", baseline: bool = True
                 ) -> TuningCurve:
    """The tuning curve of ``model`` from every candidate its log measured, in order.

    ``baseline``: time each kernel's default schedule here so that kernels not yet
    measured count with it (a few seconds; see :class:`TuningCurve`).
    """
    hw, tdir, _, tasks = _tuned_tasks(model, target, logs)
    default = default_latencies(tasks, hw.tvm_target()) if baseline else None
    return curve_from_records(tdir / "candidates", _weights(tasks), label, default)


def _stock_module(mod, tvm_target, prepack: bool = False):
    """What TVM's ``static_shape_tuning`` hands to MetaSchedule: FuseOps' kernels of the
    Relax module ``mod``; with ``prepack`` (its ``cpu_weight_prepack``), their weights
    marked layout-free, which changes every such task's workload hash."""
    passes = [relax.transform.DecomposeOpsForInference(),
              relax.transform.CanonicalizeBindings(), relax.get_pipeline("zero")]
    if prepack:
        passes.append(relax.transform.AttachAttrLayoutFreeBuffers())
    with tvm_target:
        return tvm.transform.Sequential(passes)(mod)


def tune_metaschedule(model, target, *, trials: int, work_dir, builder_timeout: float = 180.0,
                      population: int | None = None) -> TuningCurve:
    """Tune ``model`` with stock TVM (FuseOps + MetaSchedule) and return its curve.

    The baseline for :func:`plot_tuning_curves`: TVM's own task extraction, search,
    cost model and budget policy, unchanged, with ``trials`` in all. One thing differs
    from a stock run: the builder. MetaSchedule's default builder imports
    ``tvm.s_tir.tensor_intrin`` in every worker of every batch (25 s on a quiet 2-core
    machine, longer than its 30 s timeout under load, so every build fails); ours
    compiles the same scheduled module with the same ``tvm.tirx.build``, skips that
    import (see ``tvm_fusion.compat.fast_import``) and keeps its workers between batches
    (``tvm_fusion.tune.builder``). The schedules measured are the same.

    ``population`` is the evolutionary search's population size (default
    MetaSchedule's, 512); a smaller one samples fewer candidates per batch, for tiny
    budgets (the notebook tests run 4 trials). Its runner measures on every core, as
    :func:`tvm_fusion.tune` does (:func:`tvm_fusion.config.use_all_cores`).
    """
    config.use_all_cores()
    plain_task_tables()
    drop_unnamed_handlers()  # a handler without a name (a user's, pytest's) crashes MS's set-up
    import_tensor_intrinsics()
    hw = as_target(target)
    tvm_target = hw.tvm_target()
    # MetaSchedule sets its loggers' levels itself when tuning starts; silence INFO
    # globally for the call (its per-batch task table would flood the notebook).
    logging.disable(logging.INFO)
    try:
        ms.relax_integration.tune_relax(
            _stock_module(model.mod, tvm_target), params={}, target=tvm_target,
            work_dir=str(work_dir), max_trials_global=trials,
            builder=PooledBuilder(timeout_sec=builder_timeout),
            strategy=("evolutionary" if population is None else
                      ms.search_strategy.EvolutionarySearch(population_size=population)))
    finally:
        logging.disable(logging.NOTSET)
    return metaschedule_curve(model, hw, work_dir)


def metaschedule_curve(model, target, work_dir, *, label: str = "TVM MetaSchedule",
                       baseline: bool = True, prepack: bool = False) -> TuningCurve:
    """The tuning curve of stock MetaSchedule from its ``work_dir`` database.

    For a model tuned with TVM's own ``relax_integration.tune_relax`` (or the
    ``static_shape_tuning`` pipeline) on the FuseOps-fused module, so the two tuners'
    curves can be drawn side by side. ``prepack``: the database was tuned with
    ``static_shape_tuning``'s ``cpu_weight_prepack=True`` (its tasks' hashes differ).
    """
    hw = as_target(target)
    tvm_target = hw.tvm_target()
    tasks = ms.relax_integration.extract_tasks(
        _stock_module(model.mod, tvm_target, prepack), tvm_target)
    default = default_latencies(tasks, tvm_target) if baseline else None
    return curve_from_records(work_dir, _weights(tasks), label, default)


def plot_tuning_curves(curves, ax=None):
    """Best estimated latency against trials, one line per :class:`TuningCurve`.

    Dotted while some kernel has no measurement yet (the estimate is then partial).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for c in curves:
        if not c.trials:
            continue
        missing = f", {c.unmeasured} never measured" if c.unmeasured else ""
        if c.unmeasured and c.baseline:
            missing += ": default schedule"
        line, = ax.plot(c.trials, c.est_ms, label=f"{c.label} ({c.tasks} kernels{missing})")
        partial = [(t, e) for t, e, ok in zip(c.trials, c.est_ms, c.complete) if not ok]
        if partial:
            ax.plot(*zip(*partial), ls=":", color=line.get_color(), lw=3)
    ax.set_yscale("log")
    ax.set_xlabel("trials (measured candidates)")
    ax.set_ylabel("estimated model latency, ms\n(sum of kernels' best x calls)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("tuning curve: kernels not yet measured count with their default "
                 "schedule\n(dotted: some kernels not measured yet)", fontsize=9)
    ax.figure.tight_layout()
    return ax.figure


def plot_roofline(kernels, target, ax=None):
    """Each tuned kernel at (FLOPs per DRAM byte, achieved GFLOP/s) under the target's roof.

    The roof is min(peak fp32 FLOP/s, DRAM bandwidth x intensity) from the target's
    hardware description; a kernel's distance below it is what tuning left on the table.
    Marker size is the kernel's share of model time.
    """
    import matplotlib.pyplot as plt

    hw = as_target(target)
    pts = [k for k in kernels if k.gflops and k.flops > 0]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    peak = hw.peak_fp32_flops / 1e9
    bw = hw.dram_bandwidth_gbs
    lo = min([k.intensity for k in pts] + [0.05]) / 2
    hi = max([k.intensity for k in pts] + [peak / bw * 4]) * 2
    x = np.geomspace(lo, hi, 200)
    ax.plot(x, np.minimum(peak, bw * x), color="black", lw=1.5,
            label=f"roof: {peak:.0f} GFLOP/s, {bw:.0f} GB/s")
    total = sum(k.best_us * k.weight for k in pts) or 1.0
    sc = ax.scatter([k.intensity for k in pts], [k.gflops for k in pts],
                    s=[20 + 600 * k.best_us * k.weight / total for k in pts],
                    c=[k.gflops / min(peak, bw * k.intensity) for k in pts],
                    cmap="viridis", vmin=0, vmax=1, edgecolor="#333", lw=0.5, zorder=3)
    for k in sorted(pts, key=lambda k: -k.best_us * k.weight)[:5]:
        name = k.name if len(k.name) <= 24 else k.name[:22] + ".."
        ax.annotate(name, (k.intensity, k.gflops), xytext=(4, 4),
                    textcoords="offset points", fontsize=7)
    ax.figure.colorbar(sc, ax=ax, label="fraction of the roof reached")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP / DRAM byte")
    ax.set_ylabel("achieved GFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"tuned kernels on {hw.name} (size: share of model time)", fontsize=10)
    ax.figure.tight_layout()
    return ax.figure
