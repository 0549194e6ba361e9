"""Write the notebooks from the cell sources below (outputs cleared).

Edit here, run ``python notebooks/make_notebooks.py``, commit the ``.ipynb`` files: the
sources stay reviewable as plain Python and the committed notebooks never carry outputs.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

SETUP = '''%matplotlib inline
import matplotlib.pyplot as plt
import tvm_fusion as tf
from tvm_fusion import config, explore, zoo'''

NB01 = [
    ("md", """# 01: Fusion plans for three machines

What does tvm-fusion fuse in a real model, on which hardware, and why? This notebook
imports MiniLM-L3 (a 3-layer BERT sentence encoder, from a PyPI wheel), plans it for an
x86 AVX2 CPU, an NVIDIA A100 and an AMD MI250X, and explores where the plans differ and
which hardware number decided each difference. Nothing here needs a GPU: the planner
predicts time from each machine's description in `hw_targets/`."""),
    ("code", SETUP),
    ("md", "## The model and its operator graph"),
    ("code", '''name = "minilm-l3"
model = tf.import_model(zoo.fetch(name), zoo.ZOO[name].shapes, name=name)
graph = tf.build_graph(model.mod)
kinds = {}
for node in graph.nodes:
    kinds[node.kind] = kinds.get(node.kind, 0) + 1
print(f"{model.source}: inputs {[(t.name, t.shape) for t in model.inputs]}")
print(f"{len(graph.nodes)} operators: {kinds}")
print(f"{sum(n.flops for n in graph.nodes) / 1e9:.2f} GFLOP per inference")'''),
    ("md", """## The hardware

Each target is a JSON file with sourced numbers: peak FLOP/s per unit, DRAM bandwidth,
on-chip memory, parallel units, launch overhead."""),
    ("code", '''targets = ["x86_avx2", "a100", "mi250x"]
for t in targets:
    hw = tf.load_target(t)
    on_chip = (f"{hw.usable_shared_memory_per_block // 1024} KB shared/LDS per block"
               if hw.family != "cpu" else f"{hw.l2_bytes_per_unit // 1024} KB L2 per core")
    print(f"{t:9} {hw.compute_units:4} units  {hw.peak_fp32_flops / 1e12:6.2f} TFLOP/s fp32  "
          f"{hw.dram_bandwidth_gbs:7.1f} GB/s  {on_chip:28} launch {hw.launch_overhead_us} us")'''),
    ("md", """## One plan, drawn

Operators of one kernel share a colour; thick edges stay on chip, thin grey ones go
through DRAM. The tables list every kernel with its predicted time and the bytes it keeps
on chip, and every merge the planner rejected, with both predictions."""),
    ("code", '''plans = {t: tf.plan_fusion(graph, t) for t in targets}
plans["x86_avx2"]'''),
    ("md", "## The three plans side by side: only the operators grouped differently"),
    ("code", '''side = explore.compare_targets(graph, targets)
print(side)
side'''),
    ("md", """## Why? Ask the plan

`plan.explain(op)` gives the kernel an operator is in, the predicted time fused and
unfused, and each merge that was considered and rejected, with the hardware term that
decided it."""),
    ("code", '''first = side.differing_nodes()[0]
op = next(o for g in plans["a100"].groups for n, o in zip(g.nodes, g.ops) if n == first)
for t in targets:
    print(f"--- {t}")
    print(plans[t].explain(op))'''),
    ("md", "## Against TVM's FuseOps on the same machine"),
    ("code", '''fuseops = tf.plan_fusion(graph, "a100", planner="fuseops")
cmp = plans["a100"].compare(fuseops)
print(cmp)
cmp'''),
    ("code", '''fig, ax = plt.subplots(figsize=(6, 3))
labels = [f"{t}\\n{p.planner}" for t, p in plans.items()] + ["a100\\nfuseops"]
values = [p.est_us for p in plans.values()] + [fuseops.est_us]
ax.bar(labels, values, color=["#4c72b0", "#dd8452", "#55a868", "#999999"])
ax.set_ylabel("predicted time, us")
ax.set_title(f"{model.source}: predicted kernel time per plan")
fig.tight_layout()'''),
    ("md", """## Plans are plain data

A plan is JSON with a content hash and the signature of the graph it was made for; the
tuner stores it with the logs so deployment re-applies exactly what was tuned."""),
    ("code", '''import json, tempfile, pathlib
path = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
plans["mi250x"].save(path)
back = tf.FusionPlan.load(path)
assert back.hash == plans["mi250x"].hash
print(path, back.hash, f"{len(json.loads(path.read_text())['groups'])} groups")'''),
]

NB02 = [
    ("md", """# 02: Tune, deploy, compare

Tune a small model with a small budget, look at what tuning found (kernel by kernel, on
a roofline, and as a tuning curve against stock TVM MetaSchedule with the same budget),
compile a deployable library from the logs with no tuning, load it and check it against
ONNX Runtime.

The budget comes from `TVM_FUSION_NB_TRIALS` (default 64); the tests run it with 4."""),
    ("code", SETUP + '''
import tempfile, pathlib
import numpy as np
from tvm_fusion.embedded import build_embedded_model
from tvm_fusion.reference import random_inputs, run_onnxruntime, max_rel_error
TRIALS = int(config.NB_TRIALS.get())
work = pathlib.Path(tempfile.mkdtemp(prefix="tvm-fusion-nb02-"))
print("trials:", TRIALS, "work dir:", work)'''),
    ("md", "## Plan and tune on this machine (`host`)"),
    ("code", '''onnx_model = build_embedded_model()
model = tf.import_model(onnx_model, name="embedded")
hw = tf.load_target("host")
print(hw.description)
plan = tf.plan_fusion(tf.build_graph(model.mod), hw)
plan'''),
    ("code", '''report = tf.tune(model, hw, trials=TRIALS, logs=work / "logs", progress=False)
print(f"{report.trials_run} trials in {report.elapsed_s:.0f} s, {report.rejected} candidates "
      "rejected by verification")
for t in report.tasks:
    best = "no record" if t.best_us is None else f"{t.best_us:9.2f} us"
    print(f"  {t.name:58} x{t.weight}  {t.trials:3} trials  {best}")'''),
    ("md", "## The log directory: what it holds, per target"),
    ("code", '''explore.open_logs(work / "logs")'''),
    ("md", """## What tuning found

Every kernel at its arithmetic intensity and achieved GFLOP/s, under this machine's roof
(peak FLOP/s and DRAM bandwidth from its hardware description)."""),
    ("code", '''kernels = explore.kernel_results(model, hw, work / "logs")
explore.plot_roofline(kernels, hw);'''),
    ("md", """## Tuning curves: tvm-fusion against stock TVM (FuseOps + MetaSchedule)

Both get the same number of trials. The estimate after each trial is the sum over
kernels of the best latency so far times calls per inference. Stock MetaSchedule runs
with its default population (512 candidates evolved per batch; `TVM_FUSION_NB_POPULATION`,
the tests use 16 for their 4 trials)."""),
    ("code", '''ours = explore.tuning_curve(model, hw, work / "logs")
stock = explore.tune_metaschedule(model, hw, trials=TRIALS, work_dir=work / "metaschedule",
                                  population=int(config.NB_POPULATION.get()))
explore.plot_tuning_curves([ours, stock]);'''),
    ("md", "## Deploy: compile from the logs, export, load, run"),
    ("code", '''compiled = tf.compile_model(model, hw, logs=work / "logs")
lib = compiled.export(work / "embedded.so")
print(lib, "untuned kernels:", compiled.untuned or "none")
module = tf.load_module(lib)
inputs = random_inputs(model.inputs, seed=1)
got = module(*inputs)
want = run_onnxruntime(onnx_model, inputs)
err = max(max_rel_error(g, w) for g, w in zip(got, want))
print(f"max relative error against ONNX Runtime: {err:.1e}")
assert err < 1e-4'''),
    ("code", '''import time
import onnxruntime as ort
sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
feed = {t.name: a for t, a in zip(model.inputs, inputs)}
def median_ms(fn, n=200):
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3
ours_ms = median_ms(lambda: module(*inputs))
ort_ms = median_ms(lambda: sess.run(None, feed))
print(f"tvm-fusion {ours_ms:.3f} ms, ONNX Runtime {ort_ms:.3f} ms (this machine, "
      f"{TRIALS} trials; the call includes numpy -> TVM copies)")'''),
]


NB03 = [
    ("md", """# 03: The learned cost model

tvm-fusion ranks candidate schedules with an XGBoost model trained on measured tuning
records (pairwise ranking within each kernel). This notebook loads the pretrained x86
model shipped in `tuning_logs/x86_zen4/`, looks at its held-out metrics, evaluates it on
shipped records, trains a fresh model on part of those records and checks it on the
kernels it did not see, predicted against measured."""),
    ("code", SETUP + '''
import tempfile, pathlib
from IPython.display import HTML, display
from tvm_fusion import costmodel
SHIPPED = pathlib.Path(tf.__file__).resolve().parents[1] / "tuning_logs" / "x86_zen4"
ROUNDS = int(config.NB_ROUNDS.get())
hw = tf.load_target("x86_zen4")
print(hw.description)'''),
    ("md", """## The shipped model

Its sidecar says what it was trained on and how it ranks the candidates of a model it
never saw (PP-OCR cls, held out from training)."""),
    ("code", '''shipped = costmodel.load_model(SHIPPED / "costmodel.json")
display(HTML(explore.cost_model_html(shipped)))
print(costmodel.format_metrics(shipped.meta["metrics"]["holdout"]))'''),
    ("md", """## Shipped records

A slice of the embedded model's tuning records, measured on this machine: each kernel's
candidates with their measured run times. Reading them replays each schedule's trace on
its kernel and extracts the features."""),
    ("code", '''data = costmodel.load_dataset([SHIPPED / "records"], hw)
print(data.summary())
print("these kernels were in the shipped model's training data:",
      len(set(data.workloads) & shipped.train_workloads), "of", len(data.workloads))
print(costmodel.format_metrics(shipped.evaluate(data)))'''),
    ("md", """## Train a fresh model, evaluate on kernels it did not see

Hold out 40% of the kernels (all their candidates), train on the rest, and compare the
ranking with the measurements. With a few kernels this is a demonstration, not a
benchmark: the shipped model's held-out numbers above come from 107 training kernels."""),
    ("code", '''train, held = costmodel.split_holdout(data, "0.4")
print("train:", train.summary())
print("held out:", held.summary())
fresh = costmodel.train_model(train, rounds=ROUNDS, holdout=held)
display(HTML(explore.cost_model_html(fresh)))'''),
    ("code", '''fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
explore.plot_predicted_vs_measured(fresh, held, ax=axes[0], title="fresh model, held-out kernels")
explore.plot_predicted_vs_measured(shipped, data, ax=axes[1], title="shipped model, shipped records")
fig.tight_layout()'''),
    ("md", "## Saved in xgboost's own JSON, with a sidecar; no pickle"),
    ("code", '''path = pathlib.Path(tempfile.mkdtemp()) / "fresh.json"
fresh.save(path)
back = costmodel.load_model(path)
assert back.meta["feature_version"] == costmodel.FEATURE_VERSION
print(path, path.stat().st_size, "bytes;", sorted(p.name for p in path.parent.iterdir()))'''),
]


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src)
                             for kind, src in cells])
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"  # stable ids: regenerating gives no spurious diff
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


NOTEBOOKS = {"01_fusion_plans.ipynb": NB01, "02_tune_and_deploy.ipynb": NB02,
             "03_cost_model.ipynb": NB03}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
