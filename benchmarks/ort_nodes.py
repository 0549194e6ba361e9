"""ONNX Runtime's per-node times, and which ONNX nodes each of our kernels computes.

ORT side: ``SessionOptions.enable_profiling`` writes a Chrome trace whose ``cat: "Node"``
events (``name`` = ORT node name + ``_kernel_time``) time every node it ran; we sum them
over several runs. ORT runs its own optimized graph (written with
``optimized_model_filepath``): Conv+BN+activation is one node, NCHWc convs are named
after a tensor of the original graph plus ``_nchwc``, reorders get new names. Each ORT node
is traced back to the original nodes it stands for by its name and its outputs' names;
a node that only produces ORT's own tensors (a ReorderInput) takes its producer's.

Our side: the plan does not keep ONNX node names (the graph is simplified, re-laid-out
and legalized before planning), so both graphs are aligned on their heavy operators
(conv, matmul, pooling, softmax, resize, layer norm, concat) in order, by kind and output
size (``difflib``, so a combined or dropped op does not shift the rest). A *segment* is a
matched anchor with the ops after it up to the next matched anchor; an ORT node and one of
our kernels "compute the same ONNX nodes" when they lie in the same segment.
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx

# ONNX op types and our legalized op names (digits stripped) that anchor the alignment
_ONNX_KIND = {"Conv": "conv", "ConvTranspose": "convT", "MatMul": "matmul", "Gemm": "matmul",
              "MaxPool": "maxpool", "AveragePool": "avgpool", "GlobalAveragePool": "mean",
              "ReduceMean": "mean", "Softmax": "softmax", "Resize": "resize",
              "LayerNormalization": "layernorm", "Concat": "concat"}
_OUR_KIND = (("conv2d_transpose", "convT"), ("conv1d_transpose", "convT"), ("conv", "conv"),
             ("matmul", "matmul"), ("dense", "matmul"), ("batch_matmul", "matmul"),
             ("max_pool", "maxpool"), ("avg_pool", "avgpool"), ("adaptive_avg_pool", "mean"),
             ("mean", "mean"), ("softmax", "softmax"), ("resize", "resize"),
             ("layer_norm", "layernorm"), ("concatenate", "concat"))


def our_kind(op: str) -> str | None:
    """Anchor kind of one of our legalized ops (``conv2d_NCHWc3`` -> ``conv``)."""
    base = op.rstrip("0123456789")
    return next((k for prefix, k in _OUR_KIND if base.startswith(prefix)), None)


def _numel(shape) -> int:
    return int(np.prod([max(int(d), 1) for d in shape], dtype=np.int64)) if shape else 1


def onnx_shapes(proto: onnx.ModelProto) -> dict[str, int]:
    """Element count of every tensor ONNX shape inference knows."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    out = {}
    g = inferred.graph
    for vi in list(g.value_info) + list(g.output) + list(g.input):
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[vi.name] = _numel([d.dim_value for d in dims])
    return out


def align(proto: onnx.ModelProto, graph) -> dict[int, int]:
    """Our anchor node id -> index of the ONNX node it computes."""
    sizes = onnx_shapes(proto)
    nodes = list(proto.graph.node)
    ours = [(n.id, our_kind(n.op), _numel(n.shape)) for n in graph.nodes if our_kind(n.op)]
    theirs = [(i, _ONNX_KIND[n.op_type], sizes.get(n.output[0], -1))
              for i, n in enumerate(nodes) if n.op_type in _ONNX_KIND]
    sm = difflib.SequenceMatcher(None, [t[1:] for t in theirs], [o[1:] for o in ours],
                                 autojunk=False)
    pairs = {}
    for a, b, size in sm.get_matching_blocks():
        for k in range(size):
            pairs[ours[b + k][0]] = theirs[a + k][0]
    return pairs


def segments_of_onnx(proto: onnx.ModelProto, anchors: set[int]) -> list[int]:
    """Segment (its anchor's ONNX node index) of every ONNX node, in graph order."""
    first = min(anchors) if anchors else 0
    seg, cur = [], first
    for i in range(len(proto.graph.node)):
        if i in anchors:
            cur = i
        seg.append(cur)
    return seg


def segments_of_ours(graph, pairs: dict[int, int]) -> dict[int, int]:
    """Segment of every node of our graph (node ids are in binding order)."""
    first = min(pairs.values()) if pairs else 0
    out, cur = {}, first
    for n in graph.nodes:
        cur = pairs.get(n.id, cur)
        out[n.id] = cur
    return out


def named(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose unnamed nodes are named ``<OpType>_<index>``: ORT names
    them in its profile but not in the optimized model it writes, so both sides need the
    same names."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    taken = {n.name for n in out.graph.node}
    for i, n in enumerate(out.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in taken:
                name += "_"
            n.name = name
            taken.add(name)
    return out


def _seeds(orig: onnx.ModelProto, opt: onnx.ModelProto) -> dict[str, set[int]]:
    """ORT node name -> indices of the original nodes it stands for."""
    names = {n.name: i for i, n in enumerate(orig.graph.node) if n.name}
    producer = {t: i for i, n in enumerate(orig.graph.node) for t in n.output}
    opt_producer = {t: n.name for n in opt.graph.node for t in n.output}
    seeds: dict[str, set[int]] = {}
    for n in opt.graph.node:
        s = {producer[t] for t in n.output if t in producer}
        stem = n.name
        while not s and stem:
            if stem in names:
                s = {names[stem]}
            elif stem in producer:
                s = {producer[stem]}
            # "<tensor>_nchwc", "<node>_token_3", "<node>/MatMulAddFusion"
            stem = stem[:max(stem.rfind("_"), stem.rfind("/"), 0)]
        seeds[n.name] = s
    readers = defaultdict(list)
    for n in opt.graph.node:
        for t in n.input:
            readers[t].append(n.name)
    for _ in range(len(opt.graph.node)):  # ORT-only tensors: the producer's, else a reader's
        changed = False
        for n in opt.graph.node:
            if seeds[n.name]:
                continue
            got = set().union(*(seeds.get(opt_producer.get(t, ""), set()) for t in n.input))
            got = got or set().union(*(seeds[r] for t in n.output for r in readers[t]))
            if got:
                seeds[n.name], changed = got, True
        if not changed:
            break
    return seeds


class OrtProfile:
    """An ORT session with its profiler on: ``run()`` as often as wanted (interleaved
    with other systems), then ``finish()`` for the per-node times.

    Parameters
    ----------
    proto : onnx.ModelProto
    feed : dict
        Input name -> array.
    warmup : int
        Runs made at once and left out of the times.
    """

    def __init__(self, proto: onnx.ModelProto, feed: dict, *, warmup: int = 3):
        import onnxruntime as ort

        self.proto, self.feed, self.version = proto, feed, ort.__version__
        self._wd = tempfile.TemporaryDirectory(prefix="ort-profile-")
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(self._wd.name, "trace")
        so.optimized_model_filepath = os.path.join(self._wd.name, "optimized.onnx")
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(proto.SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])
        self._runs, self._kept = 0, []  # session runs made; the indices of the timed ones
        for _ in range(warmup):
            self.sess.run(None, self.feed)
            self._runs += 1

    def run(self, warm: int = 0):
        """One timed run, after ``warm`` runs left out of the times (the profiler records
        every run): a pool woken from sleep starts slow, so a timed run interleaved with
        another system's gets a warm slot of its own, as in the harness's timing."""
        for _ in range(warm):
            self.sess.run(None, self.feed)
            self._runs += 1
        self._kept.append(self._runs)
        self._runs += 1
        return self.sess.run(None, self.feed)

    def finish(self, stat: str = "median") -> dict:
        """Per-ORT-node time and what each node stands for.

        Parameters
        ----------
        stat : str
            ``median`` or ``min`` over the runs (``min`` on a loaded machine, where a
            preempted node says nothing about the node).

        Returns
        -------
        dict
            ``nodes``: ORT node name -> {``us`` (``stat`` over the timed runs),
            ``op``, ``seeds`` (original node indices)}; ``run_us``: median end-to-end
            time of those runs; ``runs``; ``version``.
        """
        events = json.loads(Path(self.sess.end_profiling()).read_text())
        opt = onnx.load(os.path.join(self._wd.name, "optimized.onnx"))
        self._wd.cleanup()
        seeds = _seeds(self.proto, opt)
        ops = {n.name: n.op_type for n in opt.graph.node}
        runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
        runs = sorted(runs, key=lambda e: e["ts"])
        runs = [runs[k] for k in self._kept if k < len(runs)]
        per_run = [defaultdict(float) for _ in runs]
        for e in events:
            if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
                continue
            for k, r in enumerate(runs):
                if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]:
                    per_run[k][e["name"][:-len("_kernel_time")]] += e["dur"]
                    break
        names = sorted({n for r in per_run for n in r})
        pick = np.min if stat == "min" else np.median
        return {"nodes": {n: {"us": float(pick([r.get(n, 0.0) for r in per_run])),
                              "op": ops.get(n, "?"), "seeds": sorted(seeds.get(n, ()))}
                          for n in names},
                "run_us": float(pick([r["dur"] for r in runs])) if runs else None,
                "runs": len(runs), "version": self.version}
