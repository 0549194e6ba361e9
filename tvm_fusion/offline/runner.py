"""Run and time an offline bundle on its device (see ``tvm_fusion.offline.bundle``).

Needs TVM's runtime and numpy only, not tvm-fusion nor TVM's compiler, so it runs where
those cannot be installed::

    TVM_USE_RUNTIME_LIB=1 python runner.py BUNDLE_DIR [--repeat 20]

Each model is run on the bundle's inputs and compared with ONNX Runtime's outputs, then
timed. Each kernel's default schedule is checked against the CPU reference, each
candidate against the default on three seeds, and each is timed with TVM's
time_evaluator. One JSON line per model and per kernel goes to ``BUNDLE_DIR/results.jsonl``
as soon as it is known: a re-run skips what is there, and a candidate that kills the
process (a sticky device error) is recorded as failed when the re-run finds it marked
in flight. A candidate still running after ``--kernel-timeout`` seconds (a schedule that
hangs) is recorded as timed out and the runner restarts itself in a fresh process,
which resumes after it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

RTOL = 1e-4  # as tune's verification (verify.KERNEL_RTOL) and ``run --rtol``
# A random schedule can be thousands of times slower than the default (a 10 ms kernel
# run for minutes on one core). One call that slow is not checked nor timed further:
# it would hold the device for the 3 seeds and the timing runs, and would never win.
SLOW_CALL_S, SLOW_FACTOR = 1.0, 100.0
# A call that never returns cannot be interrupted: past this, the runner records the
# candidate as timed out and replaces itself with a fresh process (which resumes).
KERNEL_TIMEOUT_S = 60.0


def _load_tvm(device: str):
    import tvm

    if device == "cuda":  # the runtime-only import does not load the CUDA runtime itself
        lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
        if lib.exists():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return tvm


def _register_cuda_compiler(dev) -> None:
    """Compile the CUDA source a library carries when it is loaded, for this GPU.

    The kernels travel as CUDA source, compiled at load by the global function
    ``tvm_callback_cuda_compile``; TVM's own asks the current Target for the
    architecture, which a runtime-only TVM cannot give. NVRTC first, nvcc if it fails.
    """
    import tvm_ffi
    from tvm.support import nvcc

    arch = "sm_" + dev.compute_version.replace(".", "")

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code, *_):
        try:
            return nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc")
        except Exception:  # noqa: BLE001  (no cuda-bindings: the toolkit's nvcc)
            return nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvcc")


def max_rel_error(got, want) -> float:
    """``max|got - want| / max|want|``: tvm_fusion.reference.max_rel_error, repeated here
    because the device has no tvm-fusion (tests/test_offline.py checks they agree)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf")
    if got.size == 0:
        return 0.0
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not (np.isfinite(g).all() and np.isfinite(w).all()):
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        finite = np.isfinite(g) & np.isfinite(w)
        if not (same | finite).all():
            return float("inf")
        g, w = np.where(finite, g, 0.0), np.where(finite, w, 0.0)
    return float(np.abs(g - w).max()) / max(float(np.abs(w).max()), 1e-30)


def buffers(params, seed: int, quantizes: bool = False) -> list[np.ndarray]:
    """The random buffers of tvm_fusion.tune.verify._buffers, drawn the same way."""
    wide = seed % 2 == 1 and quantizes
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in params:
        if dtype.startswith("float"):
            a = rng.standard_normal(shape)
            if wide:
                a *= 10.0 ** rng.uniform(-1.0, 3.0, shape)
            out.append(a.astype(dtype))
        elif dtype == "bool":
            out.append(rng.integers(0, 2, shape).astype(bool))
        elif dtype in ("int8", "uint8"):
            info = np.iinfo(dtype)
            out.append(rng.integers(info.min, info.max + 1, shape, dtype=dtype))
        else:
            out.append(np.zeros(shape, dtype=dtype))
    return out


class Results:
    def __init__(self, path: Path):
        self.path = path
        self.done = set()
        self.crashed: dict[str, set] = {}  # lib -> candidates a process died running
        self.timed_out: dict[str, dict] = {}  # lib -> {candidate: seconds} past the timeout
        last = None  # the last candidate started by the process that wrote this stretch
        if path.exists():
            for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short when the process died mid-write
                if not isinstance(row, dict):
                    continue
                kind = row.get("kind")
                if kind == "inflight":
                    if isinstance(row.get("lib"), str) and isinstance(row.get("name"), str):
                        last = (row["lib"], row["name"])
                    continue
                if kind == "timeout":
                    if isinstance(row.get("lib"), str) and isinstance(row.get("name"), str):
                        self.timed_out.setdefault(row["lib"], {})[row["name"]] = \
                            row.get("timeout_s")
                    last = None  # it did not crash the process: the watchdog ended it
                    continue
                if kind == "start" and last is not None:
                    self.crashed.setdefault(last[0], set()).add(last[1])
                if kind in ("model", "kernel") and isinstance(
                        row.get("label") or row.get("lib"), str):
                    self.done.add(row.get("label") or row.get("lib"))
                last = None
            if last is not None:
                self.crashed.setdefault(last[0], set()).add(last[1])
        self.write({"kind": "start"})

    def write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _outputs(result) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [r.numpy() for r in result]


def run_model(tvm, m: dict, root: Path, dev, repeat: int) -> dict:
    from tvm.runtime.vm import VirtualMachine

    data = np.load(root / m["data"])
    inputs = [data[f"in{i}"] for i in range(m["inputs"])]
    want = [data[f"out{i}"] for i in range(m["outputs"])]
    vm = VirtualMachine(tvm.runtime.load_module(str(root / m["lib"])), dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    got = _outputs(vm["main"](*args))
    err = max(max_rel_error(g, w) for g, w in zip(got, want)) if len(got) == len(want) \
        else float("inf")
    for _ in range(3):
        vm["main"](*args)
    dev.sync()
    # calls per timed sample: enough for ~10 ms, so host timer resolution does not matter
    t0 = time.perf_counter()
    vm["main"](*args)
    dev.sync()
    one = max(time.perf_counter() - t0, 1e-6)
    number = max(1, min(1000, int(0.01 / one)))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            vm["main"](*args)
        dev.sync()
        samples.append((time.perf_counter() - t0) / number)
    return {"kind": "model", "label": m["label"], "max_rel_error": err,
            "matches_onnxruntime": err <= RTOL, "median_ms": float(np.median(samples)) * 1e3,
            "min_ms": float(np.min(samples)) * 1e3, "samples_ms": [s * 1e3 for s in samples],
            "calls_per_sample": number}


class SlowCandidate(Exception):
    """A candidate whose one call took far longer than the default schedule's."""


def _time(lib, name, dev, args) -> list[float]:
    timer = lib.time_evaluator(name, dev, number=1, repeat=5, min_repeat_ms=5)
    return [float(s) for s in timer(*args).results]


def _healthy(tvm, lib, host, dev) -> bool:
    """Whether the device still runs the default schedule after a failure."""
    try:
        lib["default"](*[tvm.runtime.tensor(a, dev) for a in host])
        dev.sync()
        return True
    except Exception:  # noqa: BLE001
        return False


class Watchdog:
    """Ends a candidate's run that passes ``timeout_s``: writes a ``timeout`` row, then
    replaces this process with a fresh run of the same command (``os.execv``), which
    skips it. Armed only where the runner is its own process (``restart``); a native
    call that never returns cannot be interrupted any other way."""

    def __init__(self, results: Results, timeout_s: float | None, restart: bool):
        self.results, self.timeout_s = results, timeout_s
        self.armed = restart and bool(timeout_s)
        self._lock = threading.Lock()  # the candidate's end and the timer: one wins

    @contextlib.contextmanager
    def guard(self, lib: str, name: str, task: str):
        """Run the body of the ``with`` under the timer for candidate ``name``."""
        if not self.armed:
            yield
            return
        over = threading.Event()

        def fire():
            with self._lock:
                if over.is_set():
                    return
                self.results.write({"kind": "timeout", "lib": lib, "name": name,
                                    "timeout_s": self.timeout_s})
                print(f"{task}: {name} still running after {self.timeout_s:g} s "
                      "(--kernel-timeout); recorded as timed out, restarting in a fresh "
                      "process to resume", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os.execv(sys.executable, sys.orig_argv)

        timer = threading.Timer(self.timeout_s, fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            with self._lock:
                over.set()
                timer.cancel()


def _check_candidate(tvm, lib, name: str, dev, host: dict, want: dict,
                     default_us: float) -> dict:
    """Candidate ``name`` against the default's outputs on each seed, then timed."""
    worst = 0.0
    for s in host:
        arrays = [tvm.runtime.tensor(a, dev) for a in host[s]]
        t0 = time.perf_counter()
        lib[name](*arrays)
        dev.sync()
        took = time.perf_counter() - t0
        if took > max(SLOW_CALL_S, SLOW_FACTOR * default_us * 1e-6):
            raise SlowCandidate(f"too slow to check and time: one call took {took:.2f} s, "
                                f"the default {default_us:.4g} us")
        worst = max([worst] + [max_rel_error(a.numpy(), w) for a, w in zip(arrays, want[s])])
    secs = _time(lib, name, dev, arrays)
    return {"max_rel_error": worst, "verified": worst <= RTOL, "run_secs": secs,
            "median_us": float(np.median(secs)) * 1e6}


def run_kernel(tvm, k: dict, root: Path, dev, results: Results,
               watchdog: Watchdog | None = None) -> dict:
    row = {"kind": "kernel", "lib": k["lib"], "task": k["task"], "candidates": {}}
    lib = tvm.runtime.load_module(str(root / k["lib"]))
    seeds = (0, 1, 2)
    host = {s: buffers(k["params"], s, k.get("quantizes", False)) for s in seeds}
    total = float(sum(np.asarray(b, np.float64).sum() for b in host[0]))
    if not np.isclose(total, k["checksum"], rtol=1e-6):
        row["default_error"] = (f"random buffers differ from the exporting machine's "
                                f"(checksum {total} != {k['checksum']}): numpy's generator "
                                "changed; nothing here can be checked")
        return row
    ref = np.load(root / k["ref"])
    want = {}
    try:
        for s in seeds:
            arrays = [tvm.runtime.tensor(a, dev) for a in host[s]]
            lib["default"](*arrays)
            want[s] = [a.numpy() for a in arrays]
        errs = [max_rel_error(want[0][int(n[1:])], ref[n]) for n in ref.files]
        row["default_max_rel_error"] = max(errs) if errs else 0.0
        if row["default_max_rel_error"] > RTOL:
            row["default_error"] = (f"default schedule differs from the CPU reference by "
                                    f"{row['default_max_rel_error']:.3g}")
            return row
        secs = _time(lib, "default", dev, arrays)
        row["default_us"] = float(np.median(secs)) * 1e6
    except Exception as e:  # noqa: BLE001
        row["default_error"] = str(e).strip().splitlines()[-1][:300] if str(e) else repr(e)
        return row
    crashed = results.crashed.get(k["lib"], set())
    timed_out = results.timed_out.get(k["lib"], {})
    watchdog = watchdog or Watchdog(results, None, restart=False)
    for name in k["candidates"]:
        if name in timed_out:
            row["candidates"][name] = {
                "verified": False, "timed_out": True,
                "error": f"still running after {timed_out[name]} s (--kernel-timeout): "
                         "killed, the schedule hangs or is hopelessly slow"}
            continue
        if name in crashed:
            row["candidates"][name] = {"verified": False,
                                       "error": "the process died while running it"}
            continue
        results.write({"kind": "inflight", "lib": k["lib"], "name": name})
        try:
            with watchdog.guard(k["lib"], name, k["task"]):
                c = _check_candidate(tvm, lib, name, dev, host, want, row["default_us"])
        except SlowCandidate as e:
            c = {"verified": False, "error": str(e)}
        except Exception as e:  # noqa: BLE001
            c = {"verified": False,
                 "error": str(e).strip().splitlines()[-1][:300] if str(e) else repr(e)}
            if not _healthy(tvm, lib, host[0], dev):
                # a sticky error (an illegal address...) spoils the context for good: end
                # the process; the re-run skips this candidate (still marked in flight)
                print(f"{k['task']}: {name} left the device unusable ({c['error']}); "
                      "exiting so that a fresh process resumes", file=sys.stderr)
                sys.exit(3)
        row["candidates"][name] = c
    return row


def main(argv=None, *, restart: bool = False) -> int:
    """Run the bundle; ``restart`` (the script's own process only) arms the watchdog
    that restarts the runner past ``--kernel-timeout``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path, help="a directory written by offline.export_bundle")
    ap.add_argument("--repeat", type=int, default=20, help="timed samples per model")
    ap.add_argument("--only", choices=("models", "kernels"), help="run one part only")
    ap.add_argument("--results", type=Path, default=None,
                    help="results file (default: BUNDLE_DIR/results.jsonl)")
    ap.add_argument("--kernel-timeout", type=float, default=KERNEL_TIMEOUT_S,
                    metavar="SECONDS",
                    help="seconds one candidate may take to be checked and timed before "
                         "it is recorded as timed out and the runner restarts itself "
                         f"to resume after it (default {KERNEL_TIMEOUT_S:g}; 0: never)")
    args = ap.parse_args(argv)
    manifest = args.bundle / "device.json"
    if not manifest.exists():
        manifest = args.bundle / "bundle.json"
    bundle = json.loads(manifest.read_text())
    tvm = _load_tvm(bundle["device"])
    dev = tvm.device(bundle["device"], 0)
    if not dev.exist:
        print(f"no {bundle['device']} device here", file=sys.stderr)
        return 2
    if bundle["device"] == "cuda":
        _register_cuda_compiler(dev)
    name = getattr(dev, "device_name", None) or bundle["device"]
    results = Results(args.results or args.bundle / "results.jsonl")
    watchdog = Watchdog(results, args.kernel_timeout, restart)
    if args.only != "kernels":
        for m in bundle["models"]:
            if m["label"] in results.done:
                continue
            try:
                row = run_model(tvm, m, args.bundle, dev, args.repeat)
            except Exception as e:  # noqa: BLE001
                row = {"kind": "model", "label": m["label"],
                       "error": str(e).strip().splitlines()[-1][:300]}
            row["device_name"] = name
            results.write(row)
            print(json.dumps({k: v for k, v in row.items() if k != "samples_ms"}), flush=True)
    if args.only != "models":
        for i, k in enumerate(bundle["kernels"]):
            if k["lib"] in results.done:
                continue
            t0 = time.perf_counter()
            row = run_kernel(tvm, k, args.bundle, dev, results, watchdog)
            results.write(row)
            ok = sum(c.get("verified", False) for c in row["candidates"].values())
            best = min([c["median_us"] for c in row["candidates"].values()
                        if c.get("verified")], default=None)
            print(f"[{i + 1}/{len(bundle['kernels'])}] {k['task'][:50]}: default "
                  f"{row.get('default_us', float('nan')):.2f} us, best "
                  f"{best if best is None else round(best, 2)} us, {ok}/"
                  f"{len(row['candidates'])} verified"
                  + (f" ({row['default_error']})" if "default_error" in row else "")
                  + f" [{time.perf_counter() - t0:.1f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(restart=True))
