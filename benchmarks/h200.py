"""H200 benchmark: tvm-fusion's CUDA kernels against PyTorch eager and torch.compile.

One run on the device machine (one NVIDIA H200, PyTorch and Triton installed, no TVM,
nothing reachable outside it) does, per model, within a wall-clock budget:

1. import the model into Relax, plan its fusion for ``h200`` (sm_90), apply the plan;
2. ``tvm-fusion default``: every fused kernel with dlight's default GPU schedule;
3. ``tvm-fusion tuned``: MetaSchedule over the same fused kernels with a small budget,
   records written to ``tuning_logs/h200/<model>/`` (MetaSchedule JSON databases) and
   copied to ``$OUT``; kernels without a record keep the default schedule;
4. ``torch eager`` and ``torch.compile`` of the same network with the same weights;
5. every system's output checked against PyTorch eager (max relative error), every
   system timed the same way (device-resident inputs, warm-up, median of repeats);
6. a results table (Markdown) and JSON written to ``$OUT`` (default ``out/h200``).

Models: ``embedded`` (tvm-fusion's built-in ONNX model; its PyTorch twin is built from
the same initializers) and ``resnet18`` (a ResNet-18 defined below in PyTorch, seeded
weights, exported to ONNX in the run: both sides run the same network and weights).
Each system and each model fails soft: an error becomes a row with the error, the rest
still runs.

Prepare HERE (this machine; it downloads two wheels from PyPI and repacks TVM so the
working tree that travels stays under 64 MiB)::

    .venv/bin/python benchmarks/h200.py --prepare

which writes ``.whl/`` (ignored by git) and prints the device command to run, e.g.::

    mkdir -p /tmp/site && tar xJf .whl/tvm.tar.xz -C /tmp/site && python3 -m pip install
    -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 python3 benchmarks/h200.py --out $OUT
    --budget-s 480

with ``carry: [".whl"]`` and ``timeout_s`` 600. After the run, merge ``$OUT``'s
``tuning_logs_h200/*`` into ``tuning_logs/h200/`` (``tvm-fusion logs merge``: it already
holds records measured through ``tvm-fusion offline``, see its README) and put the
table into benchmarks/RESULTS.md. Not run yet: the one lent H200 session used the
offline route (``benchmarks/offline_device.sh``), which needs no TVM compiler there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = "h200"
TVM_PIN = "apache-tvm==0.27.0.post1"
FFI_PIN = "apache-tvm-ffi==0.1.14.post1"


# ---- preparation (here, not on the device) --------------------------------------------

def prepare(whl_dir: Path) -> int:
    """Download the TVM wheels for the device's Python 3.12 and repack TVM as tar.xz."""
    whl_dir.mkdir(exist_ok=True)
    plats = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                         "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                                         "manylinux2014_x86_64")]
    dl = Path("/tmp/h200-wheels")
    dl.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *plats, "-d", str(dl),
                    TVM_PIN, FFI_PIN], check=True)
    for old in whl_dir.glob("*"):
        old.unlink()
    (ffi,) = dl.glob("apache_tvm_ffi-*.whl")
    shutil.copy(ffi, whl_dir / ffi.name)
    (tvm_whl,) = dl.glob("apache_tvm-*.whl")
    # the wheel (100 MB; 63.6 MB as plain xz -9) is over the 64 MiB a call carries:
    # unzip, drop what a run never loads (CUTLASS headers, the web runtime), and xz with
    # the x86 branch filter: 60.4 MB (measured 2026-11-29), plus the 3.3 MB tvm-ffi
    # wheel and the 1.5 MB tree, under 64 MiB. About 20 minutes on 2 busy cores.
    stage = dl / "tvm"
    shutil.rmtree(stage, ignore_errors=True)
    subprocess.run(["unzip", "-q", "-o", str(tvm_whl), "-d", str(stage)], check=True)
    for unused in ("tvm/3rdparty/cutlass", "tvm/web"):
        shutil.rmtree(stage / unused, ignore_errors=True)
    subprocess.run(f"tar cf - -C {stage} . | xz --x86 --lzma2=preset=9e,dict=256MiB -T1 "
                   f"> {whl_dir / 'tvm.tar.xz'}", shell=True, check=True)
    total = sum(p.stat().st_size for p in whl_dir.glob("*"))
    print(f"wrote {whl_dir}: {total / 2**20:.1f} MiB "
          f"({', '.join(p.name for p in sorted(whl_dir.glob('*')))})")
    if total > 60 * 2**20:
        print("warning: over 60 MiB; the working tree that travels must stay under 64 MiB")
    print("\ndevice run (carry ['.whl'], timeout_s 600):\n  " + device_command())
    return 0


def device_command(budget_s: int = 480) -> str:
    return ("mkdir -p /tmp/site && tar xJf .whl/tvm.tar.xz -C /tmp/site && python3 -m pip "
            "install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && "
            "PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 python3 benchmarks/h200.py "
            f"--out $OUT --budget-s {budget_s}")


# ---- models ----------------------------------------------------------------------------

def torch_embedded(onnx_model):
    """The embedded ONNX model as a PyTorch module with the same weights."""
    import torch
    from onnx import numpy_helper

    w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
         for t in onnx_model.graph.initializer}
    nn = torch.nn

    def conv_bn(name, cin, cout):
        conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        bn = nn.BatchNorm2d(cout, eps=1e-5)
        with torch.no_grad():
            conv.weight.copy_(w[f"{name}.w"])
            bn.weight.copy_(w[f"{name}.gamma"])
            bn.bias.copy_(w[f"{name}.beta"])
            bn.running_mean.copy_(w[f"{name}.mean"])
            bn.running_var.copy_(w[f"{name}.var"])
        return nn.Sequential(conv, bn)

    def linear(name, cin, cout):
        lin = nn.Linear(cin, cout)
        with torch.no_grad():
            lin.weight.copy_(w[f"{name}.w"])
            lin.bias.copy_(w[f"{name}.b"])
        return lin

    class Embedded(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.block = conv_bn("stem", 3, 16), conv_bn("block", 16, 16)
            self.fc1, self.fc2 = linear("fc1", 16, 64), linear("fc2", 64, 10)

        def forward(self, x):
            h = torch.relu(self.stem(x))
            h = torch.relu(self.block(h) + h)
            h = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(h, 1), 1)
            h = self.fc1(h)
            h = h * torch.sigmoid(h)
            return torch.softmax(self.fc2(h), dim=-1)

    return Embedded().eval()


def torch_resnet18(seed: int = 0):
    """ResNet-18 (He et al. 2016, the torchvision layout) with seeded random weights."""
    import torch

    nn = torch.nn
    torch.manual_seed(seed)

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (self.down(x) if self.down is not None else x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            h = self.layers(self.stem(x))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(h, 1), 1))

    net = ResNet18().eval()
    with torch.no_grad():  # non-trivial BN statistics, so folding them is exercised
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net


def to_onnx(net, shape, path: Path):
    """Export ``net`` (legacy TorchScript exporter: plain ONNX ops TVM imports)."""
    import torch

    x = torch.randn(*shape)
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    import onnx

    return onnx.load(str(path))


def make_models(work: Path):
    """(name, onnx model, torch module, input shape) of each benchmarked model."""
    from tvm_fusion.embedded import INPUT_SHAPE, build_embedded_model

    emb = build_embedded_model()
    out = [("embedded", emb, lambda: torch_embedded(emb), INPUT_SHAPE)]

    out.append(("resnet18", None, torch_resnet18, (1, 3, 224, 224)))
    return out


# ---- timing ----------------------------------------------------------------------------

def time_torch(fn, x, *, warmup: int, repeat: int) -> float:
    """Median ms of ``fn(x)`` over ``repeat`` runs, timed with CUDA events."""
    import torch

    with torch.no_grad():
        for _ in range(warmup):
            fn(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_tvm(vm, dev, arr, *, repeat: int) -> float:
    """Median ms of the VM's ``main`` (TVM's time_evaluator syncs the device per run)."""
    timer = vm.time_evaluator("main", dev, number=10, repeat=repeat, min_repeat_ms=50)
    return float(statistics.median(timer(arr).results)) * 1e3


def rel_err(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


# ---- tvm-fusion on the GPU ------------------------------------------------------------

def build_tvm(fused, hw, database=None):
    """Build a fused Relax module: tuned records where there are, dlight elsewhere."""
    import tvm
    from tvm import relax

    from tvm_fusion.deploy.build import _lowering_passes
    from tvm_fusion.gpu import default_gpu_schedule, raise_on_violations
    from tvm_fusion.schedules.tir_check import check_scheduled

    target = hw.tvm_target()
    with target, tvm.transform.PassContext(opt_level=3):
        mod = fused
        if database is not None:
            with database:
                mod = relax.transform.MetaScheduleApplyDatabase()(mod)
        tuned = sum(1 for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)
                    and f.attrs and f.attrs.get("tirx.is_scheduled", False))
        mod = default_gpu_schedule(mod, target)
        raise_on_violations(check_scheduled(mod, hw))
        lower = tvm.transform.Sequential(_lowering_passes(target))
        ex = relax.build(lower(mod), target=target, relax_pipeline=None)
    return ex, tuned


def tune_fused(fused, hw, work_dir: Path, trials: int, seed: int):
    """MetaSchedule over the fused kernels; returns (database, cost model used)."""
    import logging

    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion.compat.fast_import import build_kernel, import_tensor_intrinsics

    import_tensor_intrinsics()
    try:
        import xgboost  # noqa: F401

        cost_model = "xgb"
    except ImportError:  # the device image has no xgboost: random ranking, said so
        cost_model = "random"
    work_dir.mkdir(parents=True, exist_ok=True)
    db = ms.relax_integration.tune_relax(
        mod=fused, params={}, target=hw.tvm_target(), work_dir=str(work_dir),
        max_trials_global=trials, num_trials_per_iter=16, cost_model=cost_model,
        builder=ms.builder.LocalBuilder(timeout_sec=60, f_build=build_kernel),
        runner=ms.runner.LocalRunner(timeout_sec=30), seed=seed)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    return db, cost_model


# ---- the run --------------------------------------------------------------------------

def run(args) -> int:
    import numpy as np

    t0 = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - t0)  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    env: dict = {"python": sys.version.split()[0], "machine": platform.node()}
    try:
        import torch

        env.update(torch=torch.__version__, cuda=torch.version.cuda,
                   gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except Exception as e:  # noqa: BLE001  (fail soft: the TVM rows can still run)
        env["torch_error"] = repr(e)
    try:
        import tvm

        env.update(tvm=tvm.__version__, tvm_cuda=bool(tvm.cuda(0).exist))
    except Exception as e:  # noqa: BLE001
        env["tvm_error"] = repr(e)
    print("environment:", json.dumps(env))

    import tvm_fusion as tf

    hw = tf.load_target(TARGET)
    work = Path("/tmp/h200-bench")
    work.mkdir(exist_ok=True)
    models = make_models(work)
    per_model_tune_s = args.tune_s
    for name, onnx_model, make_torch, shape in models:
        if args.models and name not in args.models:
            continue
        rng = np.random.default_rng(args.seed)
        x = rng.standard_normal(shape).astype("float32")
        ref = None

        def row(system, **kw):
            r = {"model": name, "system": system, **kw}
            rows.append(r)
            print(json.dumps(r), flush=True)
            return r

        try:
            net = make_torch()
            if onnx_model is None:
                onnx_model = to_onnx(net, shape, work / f"{name}.onnx")
        except Exception as e:  # noqa: BLE001
            row("model", error=f"{type(e).__name__}: {e}")
            continue
        if args.build_only:
            try:
                model = tf.import_model(onnx_model, name=name)
                graph = tf.build_graph(model.mod)
                plan = tf.plan_fusion(graph, hw)
                b0 = time.monotonic()
                _, tuned = build_tvm(tf.apply_plan(graph, plan), hw)
                row("tvm-fusion default (dlight)", built=True, kernels=len(plan.groups),
                    build_s=round(time.monotonic() - b0, 1))
            except Exception as e:  # noqa: BLE001
                row("tvm-fusion default (dlight)", error=f"{type(e).__name__}: {e}",
                    trace=traceback.format_exc(limit=3)[-600:])
            continue
        # PyTorch eager: the reference
        try:
            import torch

            net = net.cuda()
            xt = torch.from_numpy(x).cuda()
            with torch.no_grad():
                ref = net(xt).float().cpu().numpy()
            ms_ = time_torch(net, xt, warmup=10, repeat=args.repeat)
            row("torch eager", ms=ms_, rel_err=0.0)
        except Exception as e:  # noqa: BLE001
            row("torch eager", error=f"{type(e).__name__}: {e}")
        # torch.compile (Inductor + Triton)
        try:
            c0 = time.monotonic()
            comp = torch.compile(net)
            with torch.no_grad():
                y = comp(xt).float().cpu().numpy()
            compile_s = time.monotonic() - c0
            ms_ = time_torch(comp, xt, warmup=10, repeat=args.repeat)
            row("torch.compile", ms=ms_, rel_err=rel_err(y, ref) if ref is not None else None,
                compile_s=round(compile_s, 1))
        except Exception as e:  # noqa: BLE001
            row("torch.compile", error=f"{type(e).__name__}: {e}")
        # tvm-fusion: plan, default schedules, tuned schedules
        try:
            import tvm
            from tvm import relax

            model = tf.import_model(onnx_model, name=name)
            graph = tf.build_graph(model.mod)
            plan = tf.plan_fusion(graph, hw)
            fused = tf.apply_plan(graph, plan)
            dev = tvm.cuda(0)
            arr = tvm.runtime.tensor(x, dev)
        except Exception as e:  # noqa: BLE001
            row("tvm-fusion", error=f"{type(e).__name__}: {e}")
            continue

        def tvm_row(system, database=None, **extra):
            try:
                b0 = time.monotonic()
                ex, tuned = build_tvm(fused, hw, database)
                if args.build_only:  # no GPU: built and resource-checked, not run
                    row(system, built=True, kernels=len(plan.groups), tuned_kernels=tuned,
                        build_s=round(time.monotonic() - b0, 1))
                    return
                vm = relax.VirtualMachine(ex, dev)
                y = vm["main"](arr)
                y = (y if hasattr(y, "numpy") else y[0]).numpy()  # one output or a tuple
                ms_ = time_tvm(vm, dev, arr, repeat=args.repeat)
                row(system, ms=ms_, rel_err=rel_err(y, ref) if ref is not None else None,
                    kernels=len(plan.groups), tuned_kernels=tuned,
                    planner_predicted_ms=round(plan.est_us / 1e3, 4),
                    build_s=round(time.monotonic() - b0, 1), **extra)
            except Exception as e:  # noqa: BLE001
                row(system, error=f"{type(e).__name__}: {e}",
                    trace=traceback.format_exc(limit=3)[-600:])

        tvm_row("tvm-fusion default (dlight)")
        if left() < per_model_tune_s + 60:
            row("tvm-fusion tuned", error=f"skipped: {left():.0f} s left of the budget")
            continue
        try:
            logs = ROOT / "tuning_logs" / TARGET / name
            trials = args.trials_per_kernel * len(plan.groups)
            s0 = time.monotonic()
            db, cm = tune_fused(fused, hw, logs, trials, args.seed)
            tune_s = time.monotonic() - s0
            dst = out / "tuning_logs_h200" / name
            dst.mkdir(parents=True, exist_ok=True)
            for f in ("database_workload.json", "database_tuning_record.json"):
                if (logs / f).exists():
                    shutil.copy(logs / f, dst / f)
            tvm_row("tvm-fusion tuned", database=db, trials=trials, cost_model=cm,
                    tune_s=round(tune_s, 1))
        except Exception as e:  # noqa: BLE001
            row("tvm-fusion tuned", error=f"{type(e).__name__}: {e}",
                trace=traceback.format_exc(limit=3)[-600:])

    (out / "h200_results.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    table = results_table(rows, env)
    (out / "h200_results.md").write_text(table + "\n")
    print("\n" + table)
    return 0


def results_table(rows, env) -> str:
    gpu = env.get("gpu") or "no GPU seen"
    lines = [f"H200 run: {gpu}, torch {env.get('torch')}, TVM {env.get('tvm')}",
             "", "| model | system | median ms | rel. error vs eager | notes |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r or "ms" not in r:
            if "error" not in r:
                lines.append(f"| {r['model']} | {r['system']} | - | - | built, not run "
                             f"({r.get('kernels')} kernels, {r.get('build_s')} s) |")
                continue
            lines.append(f"| {r['model']} | {r['system']} | - | - | {r['error'][:120]} |")
            continue
        notes = ", ".join(f"{k}={r[k]}" for k in ("kernels", "tuned_kernels", "trials",
                                                 "cost_model", "tune_s", "compile_s",
                                                 "planner_predicted_ms") if k in r)
        err = r.get("rel_err")
        lines.append(f"| {r['model']} | {r['system']} | {r['ms']:.4f} | "
                     f"{'-' if err is None else f'{err:.2e}'} | {notes} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", action="store_true",
                   help="here, not on the device: fetch and repack the TVM wheels into .whl/")
    p.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "out" / "h200")))
    p.add_argument("--budget-s", type=float, default=480,
                   help="wall-clock budget of the whole run; tuning is skipped when short")
    p.add_argument("--tune-s", type=float, default=150,
                   help="time one model's tuning is expected to take (for the budget check)")
    p.add_argument("--trials-per-kernel", type=int, default=8)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", nargs="*", help="subset of: embedded resnet18")
    p.add_argument("--build-only", action="store_true",
                   help="no GPU needed: import, plan and build every model's CUDA kernels "
                        "(a check here that the device run will get that far)")
    args = p.parse_args(argv)
    if args.prepare:
        return prepare(ROOT / ".whl")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
