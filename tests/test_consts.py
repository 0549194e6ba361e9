"""Inputs fixed as constants (``--const``, ``import_model(consts=...)``): a top-level If
on such an input folds to the branch it takes (issue 17: silero-vad's ``sr``)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

import onnx_cases as oc
from tvm_fusion import build_graph, compile_model, import_model, load_module
from tvm_fusion.errors import ModelImportError
from tvm_fusion.reference import max_rel_error, run_onnxruntime

SILERO_SHAPES = {"input": (1, 512), "state": (2, 1, 128)}


@pytest.mark.parametrize("rate, op", [(16000, "relu"), (8000, "tir_negative")])
def test_const_input_folds_the_if_to_the_branch_taken(rate, op, tmp_path):
    model = import_model(oc.branchy(), consts={"sr": rate})
    assert [i.name for i in model.inputs] == ["x"] and int(model.consts["sr"]) == rate
    assert [n.op for n in build_graph(model.mod).nodes] == [op]
    module = load_module(compile_model(model, "host").export(tmp_path / "b.so"))
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    (got,) = module(x)
    (want,) = run_onnxruntime(oc.branchy(), [x, np.array(rate, np.int64)])
    np.testing.assert_array_equal(got, want)


def test_const_changes_the_model_hash():
    a = import_model(oc.branchy(), consts={"sr": 16000}).model_hash
    b = import_model(oc.branchy(), consts={"sr": 8000}).model_hash
    assert a != b


@pytest.mark.parametrize("consts, match", [
    ({"rate": 1}, "has no input 'rate'; its inputs are 'x', 'sr'"),
    ({"sr": [1, 2]}, "input 'sr' of branchy is a scalar, the value has 2 element"),
])
def test_bad_const_names_the_input(consts, match):
    with pytest.raises(ModelImportError, match=match):
        import_model(oc.branchy(), consts=consts)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tvm_fusion", *args], capture_output=True,
                          text=True, timeout=600)


def test_cli_const_usage_error_is_exit_2():
    r = _cli("plan", "embedded", "--const", "x=abc")
    assert r.returncode == 2 and "bad constant 'x=abc'" in r.stderr + r.stdout
    assert "Traceback" not in r.stderr


def test_silero_vad_with_const_sr_matches_onnxruntime(zoo_model, tmp_path):
    """The original silero-vad file (a top-level If on sr) imports, plans, compiles and
    matches ONNX Runtime with sr fixed; run --compare feeds ONNX Runtime the same sr."""
    path = zoo_model("silero-vad")
    model = import_model(path, SILERO_SHAPES, consts={"sr": 16000}, name="silero-vad")
    assert [i.name for i in model.inputs] == ["input", "state"]
    lib = compile_model(model, "host").export(tmp_path / "silero.so")
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.5, 0.5, (1, 512)).astype(np.float32)
    state = rng.uniform(-0.5, 0.5, (2, 1, 128)).astype(np.float32)
    got = load_module(lib)(x, state)
    want = run_onnxruntime(onnx.load(path), [x, np.array(16000, np.int64), state])
    for g, w in zip(got, want):
        assert max_rel_error(g, w) < 1e-4
    r = _cli("run", str(lib), "--compare", str(path), "--repeat", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok ") == 2
