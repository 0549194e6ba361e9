"""Each conv kernel of a model in NCHW against the same conv in NCHW{c}c, side by side.

``python -m benchmarks.conv_layouts MODEL[@NAME=D1,D2,...]... [-o out.json]`` (a model
and its input shapes, ``@``-separated)
plans each model in both layouts (``--layout nchw`` and ``nchwc``), makes the kernels
tuning would see (``make_schedulable``, weights prepacked), pairs the fused conv kernels
of the two plans by their anchor conv (the n-th conv of one graph is the n-th of the
other), schedules each with the rule default that ``compile`` gives a kernel without a
record (``tune/fallback.py``, no cost model, no measurement), builds it as tuning
measures it (the weight layout rewrite left out: it runs once, at compile) and times
both with ``time_evaluator``, interleaved, the best of the rounds.

The planner prices a conv vectorized along W in NCHW with the ``conv_nchw`` share and
an NCHW{c}c conv with ``gemm`` (:mod:`tvm_fusion.plan.cpu_efficiency`); the ratio of the
two times over the pairs (FLOP-weighted geometric mean) is what ``conv_nchw / gemm``
should be. It prints one row per pair and that ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROUNDS = 5


def _conv_kernels(model, hw, tvm_target, layout: str) -> list[tuple]:
    """(index of its anchor conv among the graph's convs, task, kernel name, anchor
    node) per fused conv kernel of the plan in ``layout``."""
    from tvm_fusion.plan import plan_model
    from tvm_fusion.tune.schedulable import make_schedulable

    graph, plan = plan_model(model.mod, hw, "cost", layout=layout)
    plan, _, tasks = make_schedulable(graph, plan, hw, tvm_target, prepack=True)
    convs = [n.id for n in graph.nodes if n.kind == "gemm" and "conv" in n.op]
    order = {nid: k for k, nid in enumerate(convs)}
    by_name = {t.task_name: t for t in tasks}
    out = []
    for g in plan.groups:
        anchors = [n for n in g.nodes if n in order]
        task = by_name.get(g.name)
        if len(anchors) == 1 and task is not None:
            out.append((order[anchors[0]], task, g.name, graph.nodes[anchors[0]]))
    return out


def _time_rule_default(task, tvm_target, space_gen, seed: int = 0):
    import tvm

    from tvm_fusion.tune.fallback import _rule_default
    from tvm_fusion.tune.fast_math import vectorizable_exp
    from tvm_fusion.tune.verify import _buffers

    wl = task.dispatched[0]
    mod = _rule_default(wl, tvm_target, space_gen, None, seed)
    if mod is None:
        return None
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)  # as measured
    with vectorizable_exp():  # as compile and the builder build it
        lib = tvm.tirx.build(mod, target=tvm_target)
    args = [tvm.runtime.tensor(a) for a in _buffers(mod["main"], 0)]
    return lib.time_evaluator("main", tvm.cpu(), number=1, repeat=5, min_repeat_ms=20), args


def measure(model, hw) -> list[dict]:
    """One row per paired conv kernel: both times (us), FLOPs and the NCHW/NCHWc ratio."""
    from tvm_fusion.tune.driver import _resolve_space, _space_gen
    from tvm_fusion.tune.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()
    tvm_target = hw.tvm_target()
    space_gen = _space_gen(_resolve_space(None, tvm_target), tvm_target, None)
    nchw = {k: (t, name, node) for k, t, name, node in _conv_kernels(model, hw, tvm_target, "nchw")}
    blocked = {k: (t, name, node) for k, t, name, node in
               _conv_kernels(model, hw, tvm_target, "nchwc")}
    rows = []
    seen = set()
    for k in sorted(set(nchw) & set(blocked)):
        (ta, na, node), (tb, nb, _) = nchw[k], blocked[k]
        if "NCHWc" not in nb or (ta.task_name, tb.task_name) in seen:
            continue  # not blocked in the other graph, or a repeated layer timed already
        seen.add((ta.task_name, tb.task_name))
        timers = [_time_rule_default(ta, tvm_target, space_gen),
                  _time_rule_default(tb, tvm_target, space_gen)]
        if None in timers:
            continue
        best = [math.inf, math.inf]
        for _ in range(ROUNDS):  # interleaved: both see the same machine
            for j, (timer, args) in enumerate(timers):
                best[j] = min(best[j], float(np.median(timer(*args).results)) * 1e6)
        rows.append({"conv": k, "nchw_kernel": na, "nchwc_kernel": nb,
                     "mflop": node.flops / 1e6, "shape": list(node.shape),
                     "nchw_us": best[0], "nchwc_us": best[1], "ratio": best[0] / best[1]})
        print(f"{na[:44]:<44} {nb[:44]:<44} {node.flops / 1e6:8.2f} MFLOP "
              f"{best[0]:9.1f} {best[1]:9.1f} us  {best[0] / best[1]:5.2f}x", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", metavar="MODEL[@NAME=D1,D2,...]",
                    help="an .onnx file or zoo name, with its input shapes after @")
    ap.add_argument("--target", default="host")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)

    import tvm_fusion as tf
    from tvm_fusion.model_spec import load_model_spec

    hw = tf.load_target(args.target)
    out = {}
    for arg in args.models:
        spec, *shapes = arg.split("@")
        model = load_model_spec(spec, shapes or None)
        print(f"# {spec}", flush=True)
        out[spec] = measure(model, hw)
    rows = [r for rs in out.values() for r in rs]
    if not rows:
        print("no conv kernel was blocked in NCHW{c}c", file=sys.stderr)
        return 1
    w = np.array([r["mflop"] for r in rows])
    ratio = float(np.exp((w * np.log([r["ratio"] for r in rows])).sum() / w.sum()))
    print(f"{len(rows)} pairs; FLOP-weighted geometric mean NCHW / NCHW{{c}}c: {ratio:.3f} "
          f"(conv_nchw / gemm = {1 / ratio:.3f})")
    if args.output:
        args.output.write_text(json.dumps({"pairs": out, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
