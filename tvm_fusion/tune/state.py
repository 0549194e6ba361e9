"""The state of one tuning run, and the one place a checked candidate is committed."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from ..schedules.default import default_schedule
from .budget import stalled
from ..logs.dirs import append_jsonl
from ..logs.manifest import add_trials
from .measure import NEAR_TIE, TIMEOUT_MARK, device_type, median_us, remeasure, valid_secs
from .verify import KernelVerifier, Outcome, Verdict


def _latency_us(result) -> float | None:
    """The median of a runner result's repeats; None for an error, or for times that
    are none (a NaN, zero or negative time a remote device reported is no measurement)."""
    if result.error_msg is not None or not valid_secs(result.run_secs):
        return None
    return median_us(result.run_secs)  # the runner gives several repeats


def _is_default(trace) -> bool:
    """Whether a record's trace is the no-op :meth:`TuneState.recheck_record` commits."""
    insts = list(trace.insts)
    return len(insts) == 1 and insts[0].kind.name == "GetSBlock"


class TuneState:
    """One tuning run's tasks, their best verified latencies and where records go.

    The driver's measure callback feeds it each batch (:meth:`on_batch`); the cost
    model's picks for unmeasured kernels (``predicted.py``) go through :meth:`settle`,
    the one place a checked candidate is committed or rejected.
    """

    def __init__(self, *, tasks, target, accepted, tdir, progress, manifest, entry,
                 remote=None, hw=None, baseline=None):
        self.tasks, self.target, self.accepted, self.tdir = tasks, target, accepted, tdir
        self.progress, self.manifest, self.entry = progress, manifest, entry
        # the manifest's key of this model (its hash), for what a stop says is saved
        self.manifest_key = next((k for k, v in manifest.get("models", {}).items()
                                  if v is entry), None)
        self.verifier = KernelVerifier(target, remote=remote, hw=hw, baseline=baseline)
        self.workloads = [accepted.commit_workload(t.dispatched[0]) for t in tasks]
        self.best = []
        unmeasured = {name for name, info in entry.get("predicted", {}).items()
                      if not info.get("measured", True)}
        for task, wl in zip(tasks, self.workloads):
            top = accepted.get_top_k(wl, 1)
            # a dry run's pick has a placeholder time: the first measurement replaces it
            known = top and task.task_name not in unmeasured
            self.best.append(median_us(top[0].run_secs) if known else None)
        self.trials = [0] * len(tasks)
        self.rejected = 0
        self.timed_out = [0] * len(tasks)  # candidates the runner killed, per task
        self.stop = False
        self.index = list(range(len(tasks)))  # scheduler task id -> our task id
        # budget of the round in flight, and each task's best measured latency per trial
        self.allot: dict[int, int] = {}
        self.round_trials: dict[int, int] = {}
        self.history: list[list[float]] = [[] for _ in tasks]
        self.stalled: set[int] = set()
        # near-tie re-measurement: the runner, and a copy of each best's built module
        self.runner = None
        self.device_type = device_type(target)
        self.keep_dir: Path | None = None
        self.incumbents: dict[int, tuple[str, list]] = {}
        self.retimed = 0
        self.defaults_kept = 0  # records found slower than the default, which now deploys
        self._args: dict[int, list] = {}

    def settle(self, i: int, cand, verdict: Verdict, run_secs: list[float], *,
               measured: bool = True, **log) -> Outcome:
        """Commit or reject task ``i``'s checked candidate ``cand`` by ``verdict``.

        Accepted: its record (with ``run_secs``) goes to the deployable database and, when
        ``measured``, its median becomes the task's best. Wrong: it is counted and logged
        to ``rejected.jsonl`` with ``log``'s fields. Not faster: nothing is written.
        """
        outcome = verdict.outcome
        if outcome is Outcome.ACCEPTED:
            self.accepted.commit_tuning_record(ms.database.TuningRecord(
                trace=cand.sch.trace, workload=self.workloads[i], run_secs=run_secs,
                target=self.target, args_info=cand.args_info))
            if measured:
                self.best[i] = median_us(run_secs)
        elif outcome is Outcome.WRONG:
            self.rejected += 1
            self._log_rejected(i, cand, verdict.error, **log)
        return outcome

    def _log_rejected(self, i: int, cand, error: str, **fields) -> None:
        append_jsonl(self.tdir / "rejected.jsonl", {
            "task": self.tasks[i].task_name, **fields, "error": error,
            "trace": str(cand.sch.trace)[:4000]})

    def _timed_out(self, i: int, cand, error: str) -> None:
        """Log a candidate the runner killed: MetaSchedule keeps it in the candidates
        database as failed (never run again, on resume too); this says why."""
        self.timed_out[i] += 1
        self._log_rejected(i, cand, f"{error.strip().splitlines()[0]}: the schedule hangs "
                           "or runs far longer than the run timeout (tune --run-timeout)",
                           stage="run", timed_out=True)

    def recheck_record(self, i: int) -> bool:
        """Time task ``i``'s committed record against its default schedule, side by side;
        where the default is faster, commit the default as a record so that it deploys.

        A candidate the runner measured faster than the record but the verifier found no
        faster than the default means the record was let in by noise: PP-OCRv4 rec's
        depthwise ``fused_conv2d11`` kept a 750 us record while its candidates at 305 us
        were refused against the default. Only where ``compile`` has no default of its own
        for the kernel (fp32 on CPU): the default is the rules' default schedule (its
        trace), else the kernel's own loops (a trace that changes nothing). Its
        ``run_secs`` are the record's, scaled by the side-by-side ratio, so the database's
        top record is the faster of the two. Returns whether the default was committed.
        """
        workload = self.tasks[i].dispatched[0]
        top = self.accepted.get_top_k(self.workloads[i], 1)
        if not top or not top[0].run_secs or self._is_default(i, top[0].trace) or \
                default_schedule(workload, self.target) is not workload:
            return False  # no record, the default already is the record, or not loops
        record = top[0].as_measure_candidate().sch.mod
        verdict = self.verifier.check(i, workload, record)
        if verdict.outcome is not Outcome.NOT_FASTER or \
                not verdict.default_us < verdict.candidate_us:
            return False
        self._commit_default(i, top[0].run_secs, verdict, top[0].args_info)
        self.incumbents.pop(i, None)  # the default now: a near-tie compares with best
        return True

    def keep_default(self, i: int, verdict: Verdict, secs: list[float], args_info) -> bool:
        """Task ``i`` has no record and its best candidate so far was verified no faster
        than the default: commit the default as its record, so that ``compile``
        deploys the schedule measured fastest instead of a cost-model pick no device ran
        (PLCMOS' layout_transform + max pool kept no record at 4 trials, and the pick
        compile made in its place ran 52 us alone against 3 us predicted). Only where
        ``compile`` has no default of its own for it (as :meth:`recheck_record`). Returns
        whether it was committed."""
        workload = self.tasks[i].dispatched[0]
        if self.best[i] is not None or not verdict.default_us or not verdict.candidate_us \
                or default_schedule(workload, self.target) is not workload:
            return False
        self._commit_default(i, secs, verdict, args_info)
        self.entry.get("predicted", {}).pop(self.tasks[i].task_name, None)  # measured now
        return True

    def _is_default(self, i: int, trace) -> bool:
        """Whether ``trace`` is task ``i``'s default: the no-op of the plain loops, or the
        rule default the verifier timed."""
        rule = self.verifier.default_trace(i)
        return _is_default(trace) or (rule is not None and str(trace) == str(rule))

    def _commit_default(self, i: int, secs, verdict: Verdict, args_info) -> None:
        """Commit the default as task ``i``'s record: the rule default's trace where the
        verifier timed against it (checked there against the reference), else the no-op
        trace (the plain loops). Its ``run_secs`` are the runner's ``secs`` of the
        candidate scaled by the side-by-side ratio of the verifier's timings, so records
        stay comparable."""
        ratio = verdict.default_us / verdict.candidate_us
        scaled = [float(s) * ratio for s in secs]
        trace = self.verifier.default_trace(i)
        if trace is None:
            sch = tvm.s_tir.Schedule(self.tasks[i].dispatched[0])
            sch.get_sblock("root")  # a no-op: MetaSchedule's databases skip empty traces
            trace = sch.trace
        self.accepted.commit_tuning_record(ms.database.TuningRecord(
            trace=trace, workload=self.workloads[i],
            run_secs=scaled, target=self.target, args_info=args_info))
        self.best[i] = median_us(scaled)
        self.defaults_kept += 1

    def latency_us(self, i: int) -> float | None:
        """Best verified latency, else the default schedule's (timed once, cached)."""
        if self.best[i] is not None:
            return self.best[i]
        try:  # shared with verification, which needs it anyway
            return self.verifier.reference(i, self.tasks[i].dispatched[0])[1]
        except Exception:  # an unbuildable default: no estimate, the mean share
            return None

    def done(self, local_id: int) -> bool:
        """Whether the scheduler should end a task: allotment used, stalled, or Ctrl-C."""
        i = self.index[local_id]
        return (self.stop or i in self.stalled
                or self.round_trials.get(i, 0) >= self.allot.get(i, 0))

    def _keep_incumbent(self, i: int, build) -> None:
        if self.keep_dir is None or build is None or build.error_msg is not None:
            return
        dst = self.keep_dir / f"task{i}_{Path(build.artifact_path).name}"
        shutil.copyfile(build.artifact_path, dst)
        self.incumbents[i] = (str(dst), self._args[i])

    def _settle_tie(self, i: int, build, secs: list[float], best: float
                    ) -> tuple[list[float], bool]:
        """Time a near-tie again, interleaved with the incumbent: (repeats, it wins)."""
        if self.runner is None or build is None or build.error_msg is not None:
            return secs, True  # nothing to run again: the first measurement stands
        items = [(build.artifact_path, self._args[i])]
        if i in self.incumbents:
            items.append(self.incumbents[i])
        again = remeasure(self.runner, self.device_type, items)
        self.retimed += 1
        if not again[0]:
            return secs, False
        if len(again) > 1 and again[1]:
            return secs + again[0], median_us(again[0]) < median_us(again[1])
        return secs + again[0], median_us(secs + again[0]) < best

    def est_ms(self) -> float | None:
        known = [(b, t.weight) for b, t in zip(self.best, self.tasks) if b is not None]
        return sum(b * w for b, w in known) / 1e3 if known else None

    def on_batch(self, scheduler, task_id, candidates, results, builds=None) -> None:
        if not candidates:  # a task whose search space is exhausted
            return
        task_id = self.index[task_id]  # this round may tune a subset of the tasks
        self.trials[task_id] += len(candidates)
        self.round_trials[task_id] = self.round_trials.get(task_id, 0) + len(candidates)
        hist = self.history[task_id]
        for cand, r in zip(candidates, results):
            if r.error_msg is not None and TIMEOUT_MARK in r.error_msg:
                self._timed_out(task_id, cand, r.error_msg)
            lat = _latency_us(r)
            hist.append(min(hist[-1] if hist else math.inf,
                            math.inf if lat is None else lat))
        if stalled(hist):
            self.stalled.add(task_id)  # the scheduler ends it; its leftover is re-spread
        builds = list(builds) if builds is not None else [None] * len(candidates)
        scored = [(lat, c, r, b) for c, r, b in zip(candidates, results, builds)
                  if (lat := _latency_us(r)) is not None]
        for lat, cand, res, build in sorted(scored, key=lambda x: x[0]):
            best = self.best[task_id]
            if best is not None and lat >= best:
                break
            secs = [float(s) for s in res.run_secs]
            self._args[task_id] = cand.args_info
            if best is not None and lat > best * (1 - NEAR_TIE):
                secs, wins = self._settle_tie(task_id, build, secs, best)
                if not wins:  # noise, not a better schedule; the rest measured slower
                    break
            task = self.tasks[task_id]
            verdict = self.verifier.check(task_id, task.dispatched[0], cand.sch.mod)
            outcome = self.settle(task_id, cand, verdict, secs, latency_us=lat)
            if outcome is Outcome.ACCEPTED:
                self._keep_incumbent(task_id, build)
                self.entry.get("predicted", {}).pop(task.task_name, None)  # measured now
                break
            if outcome is Outcome.NOT_FASTER:
                if best is not None:  # faster than the record by the runner, not the default
                    self.recheck_record(task_id)
                else:  # nothing measured beat the default: it is the record
                    self.keep_default(task_id, verdict, secs, cand.args_info)
                break  # the default stays; the rest of this batch measured slower still
        add_trials(self.tdir, self.manifest, self.entry, len(candidates))  # locked, shared
        have = sum(b is not None for b in self.best)
        note = "" if have == len(self.best) else f"({have}/{len(self.best)} kernels)"
        if self.stop:
            note += " stopping after this batch"
        self.progress.update(self.entry["trials"], self.est_ms(), note=note.strip())
