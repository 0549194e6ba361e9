"""Damaged files never crash tvm-fusion: random byte flips and truncations (fixed seeds)
of a small ONNX model, of a tuning-log line and of a module's description.

Each case runs the CLI's ``main`` in this process, as ``tvm-fusion plan``, ``logs show``
or ``run`` would, and must end with exit status 0 (the damage did not matter) or 2 (a
user error naming the file): never 70, the internal-error path, nor an exception that
escapes. A failing case names the case and the one line the CLI printed; the damaged
bytes are kept in the test's temporary directory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.cli import main
from tvm_fusion.deploy.build import sidecar_path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_LOGS = ROOT / "tuning_logs" / "x86_zen4"


def _small_onnx(path: Path) -> Path:
    """MatMul, Add, Relu, Transpose and Softmax on 2x4 floats: 266 bytes, most of them
    structure rather than weights, so that flips hit names, shapes and attributes."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype("float32"), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
             helper.make_node("Softmax", ["t"], ["s"], axis=-1)]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, 2])], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _mutate(data: bytes, rng: np.random.Generator, *, ascii_only: bool = False) -> bytes:
    """``data`` cut short (3 cases in 10), or with 1-4 bytes flipped (with ``ascii_only``,
    replaced by printable ASCII: damage that keeps UTF-8 text UTF-8)."""
    if rng.random() < 0.3:
        return data[:int(rng.integers(0, len(data)))]
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(0, len(out)))
        out[i] = int(rng.integers(32, 127)) if ascii_only else out[i] ^ int(rng.integers(1, 256))
    return bytes(out)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """``main(argv)`` in this process: (exit status, what it printed to stderr)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # crash reports stay here

    def run(argv: list) -> tuple[int, str]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a skipped log line warns; not the point here
            try:
                status = main([str(a) for a in argv])
            except SystemExit as e:  # argparse's usage errors
                status = e.code
        return status, capsys.readouterr().err.strip()

    return run


def _check(cases: list[tuple[int, int, str]], what: str) -> None:
    """Every case ended as 0 or 2; else name them with their messages."""
    bad = [(k, status, err.splitlines()[-1][:200] if err else "")
           for k, status, err in cases if status not in (0, 2)]
    assert not bad, f"{len(bad)} of {len(cases)} damaged {what} crashed: {bad[:5]}"
    assert any(s == 2 for _, s, _ in cases)  # the damage was seen, not skipped silently


def test_damaged_onnx_models_are_user_errors(tmp_path, cli):
    base = _small_onnx(tmp_path / "small.onnx").read_bytes()
    rng = np.random.default_rng(41)
    cases = []
    for k in range(150):
        model = tmp_path / f"case{k}.onnx"
        model.write_bytes(_mutate(base, rng))
        status, err = cli(["plan", model, "--resources", "estimated", "--quiet"])
        cases.append((k, status, err))
        if status in (0, 2):
            model.unlink()
    _check(cases, "ONNX models")


def _log_dir(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """A copy of the shipped x86_zen4 logs; the lines of its record file."""
    tdir = tmp_path / "logs" / "x86_zen4"
    tdir.mkdir(parents=True)
    for name in ("manifest.json", "database_workload.json", "database_tuning_record.json"):
        shutil.copyfile(SHIPPED_LOGS / name, tdir / name)
    return tdir, (tdir / "database_tuning_record.json").read_bytes().splitlines(keepends=True)


def _fuzz_log_lines(tmp_path: Path, cli, *, ascii_only: bool, count: int, seed: int):
    tdir, lines = _log_dir(tmp_path)
    rng = np.random.default_rng(seed)
    cases = []
    for k in range(count):
        i = int(rng.integers(0, len(lines)))
        damaged = [*lines[:i], _mutate(lines[i], rng, ascii_only=ascii_only), *lines[i + 1:]]
        (tdir / "database_tuning_record.json").write_bytes(b"".join(damaged))
        status, err = cli(["logs", "show", tmp_path / "logs"])
        cases.append((k, status, err))
        if status not in (0, 2):
            (tmp_path / f"record{k}.json").write_bytes(b"".join(damaged))
    return cases


def test_damaged_tuning_log_lines_are_skipped(tmp_path, cli):
    """Damage that keeps the line UTF-8 text; the flips of any byte are the next test."""
    cases = _fuzz_log_lines(tmp_path, cli, ascii_only=True, count=50, seed=41)
    bad = [(k, s, e.splitlines()[-1][:200] if e else "") for k, s, e in cases if s != 0]
    assert not bad, f"a damaged record line is skipped with a warning, never fatal: {bad[:5]}"


def test_tuning_log_lines_with_any_byte_flipped_are_skipped(tmp_path, cli):
    cases = _fuzz_log_lines(tmp_path, cli, ascii_only=False, count=30, seed=42)
    bad = [(k, s, e.splitlines()[-1][:200] if e else "") for k, s, e in cases if s != 0]
    assert not bad, f"a damaged record line is skipped with a warning, never fatal: {bad[:5]}"


@pytest.fixture(scope="module")
def module(tmp_path_factory) -> Path:
    """The small model compiled for the host: m.so and m.so.json."""
    folder = tmp_path_factory.mktemp("fuzz-module")
    model = tf.import_model(_small_onnx(folder / "small.onnx"))
    return tf.compile_model(model, "host").export(folder / "m.so")


def test_damaged_module_descriptions_are_user_errors(module, tmp_path, cli):
    lib = tmp_path / "m.so"
    shutil.copyfile(module, lib)  # loaded once per case: never rewritten in this process
    base = sidecar_path(module).read_bytes()
    rng = np.random.default_rng(41)
    cases = []
    for k in range(100):
        sidecar_path(lib).write_bytes(_mutate(base, rng))
        status, err = cli(["run", lib, "--repeat", "1"])
        cases.append((k, status, err))
        if status not in (0, 2):
            shutil.copyfile(sidecar_path(lib), tmp_path / f"case{k}.so.json")
    _check(cases, "module descriptions")


ODD_VALUES = (None, -1, 0, "x", [], {}, 1e300, True, [1, 2], {"a": 1}, 2 ** 70)


def _paths(node, prefix=()):
    """Every path into a JSON value (keys and indices)."""
    yield prefix
    items = node.items() if isinstance(node, dict) else \
        enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from _paths(value, (*prefix, key))


def test_module_descriptions_with_a_value_of_another_type_are_user_errors(module, tmp_path,
                                                                           cli):
    """Valid JSON, one value replaced (``inputs[0].shape`` by ``"x"``, ...): what a byte
    flip rarely reaches. The plan and kernel lists, which ``run`` does not read, are left."""
    lib = tmp_path / "m.so"
    shutil.copyfile(module, lib)
    base = json.loads(sidecar_path(module).read_text())
    paths = [p for p in _paths(base) if p and p[0] not in ("plan", "kernels")]
    rng = np.random.default_rng(41)
    cases = []
    for k in range(60):
        info = json.loads(json.dumps(base))
        *parents, last = paths[int(rng.integers(len(paths)))]
        node = info
        for key in parents:
            node = node[key]
        node[last] = ODD_VALUES[int(rng.integers(len(ODD_VALUES)))]
        sidecar_path(lib).write_text(json.dumps(info))
        status, err = cli(["run", lib, "--repeat", "1"])
        cases.append((k, status, f"{'.'.join(map(str, (*parents, last)))}: {err}"))
    _check(cases, "module descriptions")
