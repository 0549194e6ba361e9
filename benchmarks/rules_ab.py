"""``python -m benchmarks.rules_ab``: a model tuned with and without tvm-fusion's CPU rules.

The same model, plan, seed, cost model and trial budget; the only difference is the
search space: the shipped ``search_spaces/cpu.json`` ("rules": register_tile, depthwise
and plain next to MetaSchedule's spaces) or the same file without them ("stock",
``benchmarks.gemm_probe.stock_space``). Both modules are checked against ONNX Runtime
and timed interleaved with it (``benchmarks.timing.interleave``). The budget is given per
kernel: ``--per-task`` x the number of kernels of the plan, which a first one-trial
``tune`` call learns (the driver still gives every kernel its floor of trials there, so
that call already measures part of the budget; the second continues to the total).

Run: ``python -m benchmarks.rules_ab --models minilm-l3 --per-task 8 --out DIR``
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings
from pathlib import Path

from .gemm_probe import stock_space
from .same_records import _Row
from .timing import interleave

TOLERANCE = 1e-4


def compare(name: str, per_task: int, out: Path, rounds: int, seed: int) -> dict:
    """Tune ``name`` in both spaces, check both against ONNX Runtime, time them with it."""
    import time

    import onnxruntime as ort
    import tvm
    from tvm import relax

    from tvm_fusion import zoo
    from tvm_fusion.deploy.build import compile_model
    from tvm_fusion.frontend.onnx_import import import_model
    from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
    from tvm_fusion.tune import tune
    from tvm_fusion.tune.space import load_search_space

    model = import_model(zoo.fetch(name), zoo.ZOO[name].shapes)
    inputs = random_inputs(model.inputs, seed=0)
    want = run_onnxruntime(model.onnx_model, inputs)
    args = [tvm.runtime.tensor(x) for x in inputs]
    result = {"model": name, "per_task": per_task, "arms": {}}
    rows = []
    for arm, space in (("rules", load_search_space("cpu")), ("stock", stock_space())):
        logs = out / name / arm
        t0 = time.monotonic()
        # one trial per kernel first, to learn the plan's kernel count, then the budget
        first = tune(model, "host", trials=1, logs=logs, search_space=space, seed=seed,
                     progress=False)
        report = tune(model, "host", trials=per_task * len(first.tasks), logs=logs,
                      search_space=space, seed=seed, progress=False)
        compiled = compile_model(model, "host", logs=logs)
        main = relax.VirtualMachine(compiled.executable, tvm.cpu())["main"]
        got = main(*args)
        got = [got] if isinstance(got, tvm.runtime.Tensor) else list(got)
        err = max(max_rel_error(g.numpy(), w) for g, w in zip(got, want))
        if not err <= TOLERANCE:
            raise SystemExit(f"{name} ({arm}): max rel error {err:.3g} against ONNX Runtime")
        result["arms"][arm] = {"kernels": len(report.tasks), "trials": report.trials_total,
                               "tune_s": round(time.monotonic() - t0, 1),
                               "est_ms": report.est_ms, "untuned": len(compiled.untuned),
                               "max_rel_err": err}
        rows.append(_Row(arm, call=lambda m=main: m(*args)))
    sess = ort.InferenceSession(model.onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    feed = {t.name: x for t, x in zip(model.inputs, inputs)}
    rows.append(_Row("onnxruntime", call=lambda: sess.run(None, feed)))
    interleave(rows, rounds=rounds, log=lambda *a: None)
    for row in rows:
        result["arms"].setdefault(row.name, {})["median_ms"] = statistics.median(row.times_ms)
    a = result["arms"]
    result["stock_over_rules"] = a["stock"]["median_ms"] / a["rules"]["median_ms"]
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rules_ab",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="minilm-l3")
    p.add_argument("--per-task", type=int, default=8, help="trials per kernel")
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="work directory (logs, JSON)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    results = []
    for name in args.models.split(","):
        r = compare(name, args.per_task, args.out, args.rounds, args.seed)
        a = r["arms"]
        print(f"{name} at {args.per_task} trials/kernel: rules {a['rules']['median_ms']:.3f} "
              f"ms, stock {a['stock']['median_ms']:.3f} ms (stock/rules "
              f"{r['stock_over_rules']:.2f}), ONNX Runtime {a['onnxruntime']['median_ms']:.3f}"
              f" ms", flush=True)
        results.append(r)
    (args.out / "rules-ab.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
