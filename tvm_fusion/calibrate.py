"""Measure what the cost model assumes about this machine, and write it as a target file.

``tvm-fusion calibrate --target host`` runs four probes and writes a hardware description
(the ``hw_targets`` schema) whose measured numbers each cite their probe:

``call_overhead_us``
    One serial kernel call through the Relax VM: a chain of ``CHAIN`` kernels, each an
    add over 64 x 64 floats, minus a chain of one, per kernel.
``launch_overhead_us``
    The same chain with the outer loop parallel (a fork-join of TVM's thread pool per
    kernel), minus the serial chain, per kernel: what the planner charges per parallel
    loop nest.
``dram_bandwidth_gbs``, ``cache_bandwidth_gbs``
    A parallel, vectorized copy (bytes read + bytes written per second) of a buffer far
    larger than the last-level cache, and of one that fits the cores' L2 together (the
    fork-join measured above subtracted from each call).
``peak_flops``
    fp32 and fp64 vector FMA throughput: a TVM kernel per core keeping
    :func:`fma_accumulators` independent vector accumulators in registers (more than FMA
    latency x pipes, fewer than the register file: 16 on AVX-512's 32 zmm, 12 on AVX2's
    16 ymm, where 16 spilled and halved the rate, 123 against 236 GFLOP/s on a Zen 2), so
    the FMA pipes, at the clock the cores really run, bound it. A VM's /proc/cpuinfo gives
    the nominal clock (2.6 GHz on the Zen 4 guests here) while the cores boost past 3.6
    (tuned GEMMs reached 1.4x the peak derived from it), and numpy's GEMM
    (2048^3, OpenBLAS, in a child process with ``OPENBLAS_CORETYPE`` and
    ``OPENBLAS_L2_SIZE`` unset: the machine sets them, which halves OpenBLAS' rate) ran
    below what tuned kernels reach; its rate is cited beside. ``int8_vector``, where the
    description has one, is 4x the fp32 rate (VPDPBUSD: 4 int8 MACs per 32-bit lane).

``cpu_efficiency`` (with ``--logs DIR``)
    The shares of peak tuned kernels reach (:mod:`tvm_fusion.plan.cpu_efficiency`),
    fitted to the measured kernels of the tuning logs in ``DIR`` (this machine's: the
    shares are relative to the peak of the written description), each priced on the
    new description (:mod:`tvm_fusion.costmodel.efficiency_fit`). ``--no-probe`` keeps
    the given description's numbers and fits only these.

Everything else (caches, cores, flags) comes from the detected ``host``. Timings are the
minimum over ``repeat`` runs: on a shared machine the minimum is the least disturbed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, te

from .config import use_all_cores
from .errors import TargetError
from .family import strategy
from .targets import NAME_RE, target_from_dict

CHAIN = 32           # kernels per chain in the call-overhead probes
FMA_ACCS = 16        # vector accumulators per core in the FMA probe (>= latency x pipes)
FMA_SPARE = 4        # vector registers the probe leaves for its constants and addresses
FMA_STEPS = 100_000  # FMAs per accumulator per call
SMALL = (64, 64)     # their tensors
GEMM_N = 2048
_BLAS_PROBE = """
import json, sys, time
import numpy as np
n, repeat = int(sys.argv[1]), int(sys.argv[2])
out = {}
for dtype in ("float32", "float64"):
    a, b = np.ones((n, n), dtype), np.ones((n, n), dtype)
    a @ b
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    out[dtype] = 2 * n ** 3 / best
print(json.dumps(out))
"""

def _kernel(shape, *, parallel: bool, copy: bool = False):
    """A PrimFunc: ``b = a + 1`` (or a copy) over ``shape``, outer loop parallel or not."""
    a = te.placeholder(shape, "float32", name="a")
    b = te.compute(shape, (lambda *i: a(*i)) if copy else (lambda *i: a(*i) + 1.0), name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    loops = sch.get_loops(sch.get_sblock("b"))
    if parallel:
        sch.parallel(loops[0])
    if copy and len(loops) > 1:
        sch.vectorize(sch.split(loops[-1], [None, 16])[1])
    return sch.mod["main"].with_attr("global_symbol", "k")


def _chain_vm(target, n: int, *, parallel: bool):
    """A Relax VM whose ``main`` calls the kernel ``n`` times in a chain."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SMALL, "float32"))
    with bb.function("main", [x]):
        gv = bb.add_func(_kernel(SMALL, parallel=parallel), "k")
        with bb.dataflow():
            cur = x
            for _ in range(n):
                cur = bb.emit(relax.call_tir(gv, [cur], relax.TensorType(SMALL, "float32")))
            out = bb.emit_output(cur)
        bb.emit_func_output(out)
    ex = relax.build(bb.get(), target)
    return relax.VirtualMachine(ex, tvm.cpu())


def _time_vm(vm, arg, repeat: int, number: int) -> float:
    """Minimum seconds per call of ``vm["main"](arg)``."""
    res = vm.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)(arg)
    return min(res.results)


def call_overheads(target, repeat: int) -> tuple[float, float]:
    """(serial call us, fork-join us) per kernel, from chains of CHAIN and 1 kernels."""
    arg = tvm.runtime.tensor(np.zeros(SMALL, "float32"))
    per = {}
    for parallel in (False, True):
        t_long = _time_vm(_chain_vm(target, CHAIN, parallel=parallel), arg, repeat, 50)
        t_one = _time_vm(_chain_vm(target, 1, parallel=parallel), arg, repeat, 50)
        per[parallel] = (t_long - t_one) / (CHAIN - 1) * 1e6
    return per[False], max(per[True] - per[False], 0.0)


def copy_bandwidth(target, nbytes: int, repeat: int, *, fork_join_us: float) -> float:
    """GB/s of a parallel vectorized copy of ``nbytes`` (read + written)."""
    n = max(nbytes // 4 // 1024, 1)
    lib = tvm.compile(_kernel((n, 1024), parallel=True, copy=True), target=target)
    a = tvm.runtime.tensor(np.ones((n, 1024), "float32"))
    b = tvm.runtime.tensor(np.zeros((n, 1024), "float32"))
    number = max(1, int(2e8 // max(n * 4096, 1)))
    timer = lib.jit().time_evaluator("k", tvm.cpu(), number=number, repeat=repeat)
    best = min(timer(a, b).results)
    best = max(best - fork_join_us * 1e-6, best * 0.05)
    return 2 * n * 4096 / best / 1e9


def blas_peaks(repeat: int) -> dict[str, float]:
    """FLOP/s of numpy's fp32 and fp64 GEMM (see the module docstring)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    out = subprocess.run([sys.executable, "-c", _BLAS_PROBE, str(GEMM_N), str(repeat)],
                         capture_output=True, text=True, env=env, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fma_accumulators(registers: int) -> int:
    """Accumulators of the FMA probe on a register file of ``registers`` vectors."""
    return max(1, min(FMA_ACCS, registers - FMA_SPARE))


def _fma_kernel(cores: int, lanes: int, dtype: str, accs: int = FMA_ACCS):
    """Per core, ``accs`` x ``lanes`` accumulators each updated ``FMA_STEPS`` times by
    ``acc * 0.999 + 0.001`` (a fixed point at 1: no denormals, no overflow)."""
    from tvm.script import tirx as T

    @T.prim_func
    def fma(out: T.Buffer((cores, accs, lanes), dtype)):
        T.func_attr({"global_symbol": "fma", "tir.noalias": True})
        for p in T.parallel(cores):
            acc = T.alloc_buffer((accs, lanes), dtype, scope="local")
            for j in T.unroll(accs):
                for v in T.vectorized(lanes):
                    acc[j, v] = T.Cast(dtype, j + 1)
            for _ in T.serial(FMA_STEPS):
                for j in T.unroll(accs):
                    for v in T.vectorized(lanes):
                        acc[j, v] = acc[j, v] * T.Cast(dtype, 0.999) + T.Cast(dtype, 0.001)
            for j in T.unroll(accs):
                for v in T.vectorized(lanes):
                    out[p, j, v] = acc[j, v]
    return fma


def fma_peaks(target, *, cores: int, vector_bits: int, repeat: int,
              registers: int = 32) -> dict[str, float]:
    """FLOP/s of fp32 and fp64 vector FMAs on ``cores`` cores (see the module docstring);
    ``registers``: the vector register file (:func:`fma_accumulators`)."""
    out, accs = {}, fma_accumulators(registers)
    for dtype, bits in (("float32", 32), ("float64", 64)):
        lanes = max(vector_bits // bits, 1)
        lib = tvm.compile(_fma_kernel(cores, lanes, dtype, accs), target=target)
        buf = tvm.runtime.tensor(np.zeros((cores, accs, lanes), dtype))
        best = min(lib.jit().time_evaluator("fma", tvm.cpu(), number=3, repeat=repeat)(buf)
                   .results)
        out[dtype] = 2 * cores * accs * lanes * FMA_STEPS / best
    return out


def check_inputs(base, name: str) -> None:
    """Refuse what calibration cannot do before measuring anything."""
    if not strategy(base).host_cpu:
        raise TargetError(f"calibrate measures the machine it runs on: target {base.name!r} "
                          f"is a {base.family} GPU; run `tvm-fusion calibrate --target host` "
                          "on the machine to describe (a GPU device through `offline` is "
                          "not implemented yet)")
    if not NAME_RE.fullmatch(name):
        raise TargetError(f"--name {name!r} is not a plain target name (letters, digits, "
                          "'_', '-', '.', '+'), e.g. --name my_host")


def calibrate_host(base, *, name: str, repeat: int = 5) -> dict:
    """Measure this machine and return the description of ``base`` (the detected host)
    with the measured values, in the ``hw_targets`` file schema.

    Parameters
    ----------
    base : HardwareTarget
        The detected ``host`` (caches, cores, flags, tvm_config).
    name : str
        The ``name`` of the written description.
    repeat : int
        Timed repeats per probe (the minimum is kept).

    Notes
    -----
    Calls :func:`tvm_fusion.config.use_all_cores` first: the probes' parallel kernels
    run on the threads tvm-fusion's own kernels get.
    """
    use_all_cores()
    check_inputs(base, name)
    target = base.tvm_target()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cite = f"measured by `tvm-fusion calibrate` on {when} (min of {repeat} runs)"
    call_us, fork_us = call_overheads(target, repeat)
    llc, l2 = base.llc_bytes, base.l2_bytes_per_unit * base.compute_units
    big = min(max(4 * llc, 256 << 20), 1 << 30)  # far past the LLC, within memory
    small = max(min(l2 // 4, 4 << 20), 64 << 10)
    dram = copy_bandwidth(target, big, repeat, fork_join_us=fork_us)
    cache = copy_bandwidth(target, small, max(repeat, 20), fork_join_us=fork_us)
    peaks = fma_peaks(target, cores=base.compute_units, vector_bits=base.vector_width_bits,
                      repeat=repeat, registers=base.registers_per_unit)
    blas = blas_peaks(repeat)
    doc = base.to_json_dict()
    doc["name"] = name
    doc["description"] = f"{base.description}; calibrated {when}"
    doc["launch_overhead_us"] = {"value": round(fork_us, 3), "source": (
        f"{cite}: {CHAIN} chained {SMALL[0]}x{SMALL[1]} add kernels through the Relax VM "
        f"with a parallel outer loop, minus the serial chain, per kernel (a fork-join)")}
    doc["call_overhead_us"] = {"value": round(call_us, 3), "source": (
        f"{cite}: {CHAIN} chained serial {SMALL[0]}x{SMALL[1]} add kernels through the "
        "Relax VM minus a chain of one, per kernel")}
    doc["dram_bandwidth_gbs"] = {"value": round(dram, 2), "source": (
        f"{cite}: parallel vectorized copy of {big >> 20} MB (4x the last-level cache, "
        "256 MB to 1 GB), bytes read + written per second")}
    doc["cache_bandwidth_gbs"] = {"value": round(cache, 2), "source": (
        f"{cite}: parallel vectorized copy of {small >> 10} KB (fits the cores' L2), read + "
        f"written per second, the {fork_us:.2f} us fork-join subtracted")}
    for dtype, key in (("float32", "fp32_vector"), ("float64", "fp64_vector")):
        doc["peak_flops"][key] = {"value": float(f"{peaks[dtype]:.4g}"), "source": (
            f"{cite}: {dtype} vector FMAs, {fma_accumulators(base.registers_per_unit)} "
            f"register accumulators per core on "
            f"{base.compute_units} cores (numpy's {GEMM_N}^3 GEMM, OpenBLAS with "
            "OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, reached "
            f"{blas[dtype] / 1e9:.0f} GFLOP/s)")}
    if "int8_vector" in doc["peak_flops"]:
        doc["peak_flops"]["int8_vector"] = {
            "value": float(f"{4 * peaks['float32']:.4g}"), "source": (
                f"derived: 4x the fp32 FMA rate {cite} (VPDPBUSD: 4 int8 MACs per 32-bit "
                "lane on the same datapath)")}
    target_from_dict(doc, origin="calibrated host")  # what load_target will accept
    return doc


def fit_efficiency(doc: dict, dirs: list[Path]) -> dict:
    """``doc`` with ``cpu_efficiency`` fitted to the measured CPU kernels of the tuning
    logs in ``dirs`` (each a target directory or a directory of them), every kernel
    priced on ``doc``'s description."""
    from .costmodel.efficiency_fit import efficiency_terms, fit_cpu_efficiency
    from .costmodel.group_data import kernel_records
    from .logs.tools import target_dirs
    from .costmodel.group_model import MIN_TRIALS_PER_KERNEL
    from .plan import AnalyticalCostModel

    base = {k: v for k, v in doc.items() if k != "cpu_efficiency"}
    hw = target_from_dict(base, origin="calibrated description")
    found = [t for d in dirs for t in target_dirs(Path(d), manifest_only=True, missing_ok=True)]
    records = [dataclasses.replace(r, cost_model=AnalyticalCostModel(
                   r.cost_model.graph, hw, r.cost_model.infos))
               for t in found for r in kernel_records(
                   t, min_trials_per_kernel=MIN_TRIALS_PER_KERNEL)
               if strategy(r.cost_model.hw).fitted_efficiency]
    if not records:
        raise TargetError(
            f"--logs {' '.join(map(str, dirs))}: no measured CPU kernel of a model tuned "
            f"with at least {MIN_TRIALS_PER_KERNEL:g} trials per kernel "
            f"({len(found)} tuning-log directories found); tune a model on this machine "
            "first (tvm-fusion tune MODEL --logs DIR) and pass that DIR")
    terms = efficiency_terms(records)
    eff = fit_cpu_efficiency(terms)
    pred = terms.predict(eff)
    err = statistics.median(max(p / m, m / p) for p, m in zip(pred, terms.meas))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    models = sorted({r.model for r in records})
    out = dict(doc)
    out["cpu_efficiency"] = {"value": eff.to_json(), "source": (
        f"fitted by `tvm-fusion calibrate --logs` on {when}: {len(records)} tuned kernels "
        f"of {', '.join(models)} in {', '.join(str(t) for t in found)}, priced on this "
        f"description (median error {err:.2f}x; accumulators fixed at {eff.accumulators:g}, "
        "FMA latency x pipes)")}
    target_from_dict(out, origin="calibrated description")
    return out


def write_target(doc: dict, path: Path) -> Path:
    """Write a description as JSON (``load_target(path)`` reads it back)."""
    path = Path(path)
    if path.suffix != ".json":
        raise TargetError(f"-o {path}: a target file must end in .json (load_target reads "
                          "paths ending in .json), e.g. -o my_host.json")
    if not path.parent.is_dir():
        raise TargetError(f"-o {path}: directory {path.parent} does not exist; create it or "
                          "write the file elsewhere")
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
