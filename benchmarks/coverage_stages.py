"""The stages of one coverage-corpus model, each in its own try.

Runs in a worker process of ``python -m benchmarks.coverage`` (one per model, so memory
stays bounded and a crash in native code costs one row). After every stage the result is
written to a JSON file, so what finished survives a crash or a time-out.
"""

from __future__ import annotations

import collections
import inspect
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

PLAN_TARGETS = ("x86_avx512", "a100", "mi250x")
COMPILE_TARGETS = ("host", "a100")
STAGES = ("import", *(f"plan:{t}" for t in PLAN_TARGETS),
          *(f"compile:{t}" for t in COMPILE_TARGETS), "check")
DEFAULT_TOL = 1e-4


def failure(err: BaseException) -> dict:
    """How a failed stage is recorded: the one-line message of a tvm-fusion error, or
    the traceback's last line marked as a TRACEBACK (a bug to fix)."""
    from tvm_fusion.errors import TvmFusionError

    text = " ".join(ln.strip() for ln in str(err).splitlines() if ln.strip())
    if isinstance(err, TvmFusionError):
        return {"status": "error", "kind": type(err).__name__, "message": _clip(text)}
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if "tvm_fusion" in f.filename or "benchmarks" in f.filename]
    where = f" (at {Path(ours[-1].filename).name}:{ours[-1].lineno})" if ours else ""
    last = traceback.format_exception_only(type(err), err)[-1].strip()
    return {"status": "traceback", "kind": type(err).__name__,
            "message": _clip(f"TRACEBACK: {last.splitlines()[0]}{where}"),
            "traceback": "".join(traceback.format_exception(err))[-8000:]}


def _clip(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit - 4] + " ..."


def op_histogram(proto) -> dict[str, int]:
    """Node counts by op type (domain-qualified outside the default domain), nodes inside
    subgraphs included, most frequent first."""
    counts: collections.Counter = collections.Counter()

    def walk(graph):
        for node in graph.node:
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            counts[op] += 1
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub)

    walk(proto.graph)
    return dict(counts.most_common())


def reference_feeds(entry, proto) -> tuple[dict[str, np.ndarray], list]:
    """Inputs of the original file by name (random, or the corpus' fill and consts)."""
    from tvm_fusion.frontend.shapes import (TensorInfo, graph_inputs, onnx_dtype_name,
                                            resolve_shapes)
    from tvm_fusion.reference import random_inputs

    inputs = graph_inputs(proto)
    shapes = dict(entry.model.shapes)
    for name in entry.consts:
        shapes.setdefault(name, ())
    fixed = resolve_shapes(inputs, shapes, entry.name)
    infos = [TensorInfo(i.name, fixed[i.name], onnx_dtype_name(i.type.tensor_type.elem_type))
             for i in inputs]
    arrays = random_inputs(infos, seed=0)
    feeds = {}
    for info, arr in zip(infos, arrays):
        value = entry.consts.get(info.name, entry.fill.get(info.name))
        feeds[info.name] = arr if value is None else np.full(info.shape, value, info.dtype)
    return feeds, infos


def _ort(proto, feeds: dict, optimize: bool) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feeds)]


def _max_error(got, want) -> float:
    from tvm_fusion.reference import max_rel_error

    if len(got) != len(want):
        return float("inf")
    return max((max_rel_error(g, w) for g, w in zip(got, want)), default=0.0)


def _import(entry, path: Path, name: str | None = None):
    """``(model, note)``: imported with the corpus' consts where import_model can fix
    inputs as constants, else with them as inputs (and a note saying so); ``name``
    (default the corpus name) is the model's ``source``."""
    import tvm_fusion

    params = inspect.signature(tvm_fusion.import_model).parameters
    key = next((k for k in ("consts", "constants", "const") if k in params), None)
    kwargs, note = {}, None
    if entry.consts and key:
        kwargs[key] = dict(entry.consts)
    elif entry.consts:
        note = (f"import_model cannot fix {', '.join(entry.consts)} as constants here: "
                "imported with them as inputs")
    return tvm_fusion.import_model(path, entry.model.shapes, name=name or entry.name,
                                   **kwargs), note


def run_model(entry, out: Path, skip: frozenset[str]) -> dict:
    """Run every stage of one corpus model; the result is also left in ``out``."""
    import onnx

    from tvm_fusion import zoo

    result: dict = {"name": entry.name, "family": entry.family,
                    "package": f"{entry.model.package}=={entry.model.version}",
                    "member": entry.model.member, "description": entry.model.description,
                    "shapes": {k: list(v) for k, v in entry.model.shapes.items()},
                    "consts": dict(entry.consts), "note": entry.note, "stages": {}}

    def save():
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")

    def stage(name: str, fn: Callable[[], object]) -> object:
        if name in skip or any(name.startswith(s + ":") for s in skip):
            result["stages"][name] = {"status": "skipped"}
            save()
            return None
        t0 = time.monotonic()
        try:
            value = fn()
            rec = {"status": "ok"}
            if isinstance(value, dict):
                rec.update(value.pop("_record", {}))
        except Exception as err:  # noqa: BLE001 - every stage is a row entry
            value, rec = None, failure(err)
        rec["seconds"] = round(time.monotonic() - t0, 2)
        result["stages"][name] = rec
        save()
        return value if rec["status"] == "ok" else None

    fetched = stage("fetch", lambda: {"path": zoo.fetch(entry.model)})
    if fetched is None:
        return result
    path = fetched["path"]
    result["path"] = str(path)
    proto = onnx.load(str(path))
    opsets = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    result.update(opset=opsets.get("ai.onnx"), producer=f"{proto.producer_name} "
                  f"{proto.producer_version}".strip(), ops=op_histogram(proto))
    save()

    def do_import():
        model, note = _import(entry, path)
        return {"model": model, "_record": {"note": note,
            "inputs": {t.name: [list(t.shape), t.dtype] for t in model.inputs},
            "outputs": {t.name: [list(t.shape), t.dtype] for t in model.outputs}}}

    imported = stage("import", do_import)
    if imported is None:
        return result
    model = imported["model"]
    graph_box: dict = {}

    def do_plan(target: str):
        import tvm_fusion

        if "graph" not in graph_box:
            graph_box["graph"] = tvm_fusion.build_graph(model.mod)
        plan = tvm_fusion.plan_fusion(graph_box["graph"], target)
        return {"_record": {"kernels": len(plan.groups), "ops": len(graph_box["graph"].nodes)
                            if hasattr(graph_box["graph"], "nodes") else None,
                            "est_us": round(plan.est_us, 1)}}

    for target in PLAN_TARGETS:
        stage(f"plan:{target}", lambda t=target: do_plan(t))

    built: dict = {}

    def do_compile(target: str):
        import tvm_fusion

        compiled = tvm_fusion.compile_model(model, target, logs=None)
        built[target] = compiled
        return {"_record": {"kernels": len(compiled.kernels)}}

    for target in COMPILE_TARGETS:
        stage(f"compile:{target}", lambda t=target: do_compile(t))

    def do_check():
        from benchmarks.systems import vm_runner

        feeds, _ = reference_feeds(entry, proto)
        want = _ort(proto, feeds, optimize=True)
        self_err = _max_error(_ort(proto, feeds, optimize=False), want)
        tol = max(DEFAULT_TOL, 10 * self_err)
        _, outputs = vm_runner(built["host"].executable, [feeds[t.name] for t in model.inputs])
        err = _max_error(outputs(), want)
        return {"_record": {"max_rel_err": err, "tol": tol, "ort_self_err": self_err,
                            "status": "ok" if err <= tol else "wrong"}}

    if "host" in built or "check" in skip:
        stage("check", do_check)
    else:  # nothing to check: the failure is compile:host's, not the check's
        host = result["stages"].get("compile:host", {}).get("status", "not run")
        result["stages"]["check"] = {"status": "blocked",
                                     "message": f"no host build (compile:host: {host})"}
        save()
    return result
