"""Calibrated target files: what `tvm-fusion calibrate` writes loads, is used by the cost
model, keeps unknown keys refused, and changes no shipped hash; logs keyed by an earlier
hash of a shipped description still apply, other hashes are refused with what to do.

The probes themselves take a minute on this machine (four Relax builds and two large
copies), so the suite runs one small copy probe and the CLI's refusals, not a full
calibration (benchmarks/METHODS.md has the command and its numbers).
"""

from __future__ import annotations

import json
import math

import pytest

import tvm_fusion as tf
from tvm_fusion import targets
from tvm_fusion.errors import TargetError
from tvm_fusion.plan import AnalyticalCostModel
from tvm_fusion.logs import manifest as logs
from tvm_fusion.calibrate import (FMA_ACCS, FMA_STEPS, _fma_kernel, check_inputs,
                                  copy_bandwidth, fma_peaks, write_target)

from test_bad_inputs import cli


def _calibrated_doc(**extra):
    doc = tf.load_target("x86_zen4").to_json_dict()
    doc["name"] = "zen4_cal"
    doc["call_overhead_us"] = {"value": 1.25, "source": "measured by calibrate (test)"}
    doc["cache_bandwidth_gbs"] = {"value": 150.0, "source": "measured by calibrate (test)"}
    doc["launch_overhead_us"] = {"value": 6.5, "source": "measured by calibrate (test)"}
    doc.update(extra)
    return doc


def test_calibrated_file_loads_and_the_cost_model_uses_its_call_overhead(tmp_path):
    path = tmp_path / "zen4_cal.json"
    path.write_text(json.dumps(_calibrated_doc()))
    hw = tf.load_target(path)
    assert (hw.call_overhead_us, hw.cache_bandwidth_gbs) == (1.25, 150.0)
    assert "measured by calibrate" in hw.sources["call_overhead_us"]
    # the round trip keeps the optional fields (and so the hash)
    assert targets.target_from_dict(hw.to_json_dict()).hardware_hash == hw.hardware_hash
    # a serial kernel (one 64-element add: one tile) pays the call, no fork-join
    from test_planner import _model
    from onnx import helper
    graph = tf.build_graph(_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [64])],
                                  [("y", [64])], name="tiny").mod)
    assert AnalyticalCostModel(graph, hw).launch_us([0]) == 1.25
    # the shipped x86_zen4 carries its measured call; x86_avx512 has none: CPU_CALL_US
    assert AnalyticalCostModel(graph, tf.load_target("x86_zen4")).launch_us([0]) == 0.393
    assert AnalyticalCostModel(graph, tf.load_target("x86_avx512")).launch_us([0]) == 0.5


def test_unknown_keys_stay_refused_and_shipped_logs_still_apply():
    with pytest.raises(TargetError, match="unknown key 'cache_latency_ns'"):
        targets.target_from_dict(_calibrated_doc(cache_latency_ns={"value": 1, "source": "x"}))

    # the shipped logs were keyed before int8 peaks joined x86_zen4 and h200: their hash
    # is an earlier one of the same description, and they still apply
    for name in ("x86_zen4", "h200"):
        tdir = tf.data.shipped_logs_dir() / name
        manifest = json.loads((tdir / "manifest.json").read_text())
        hw = tf.load_target(name)
        assert manifest["target"]["hardware_hash"] in (hw.hardware_hash, *hw.previous_hashes)
        assert logs.manifest_problems(manifest, tdir, hw)[1] == []


def test_logs_of_an_earlier_hash_of_a_shipped_description_still_apply(tmp_path, monkeypatch):
    hw = tf.load_target("x86_zen4")
    stored = {"schema": logs.MANIFEST_SCHEMA, "version": logs.MANIFEST_VERSION,
              "tvm": logs.versions()["tvm"],
              "target": {**logs.target_identity(hw), "hardware_hash": "0" * 64}}
    _, problems = logs.manifest_problems(stored, tmp_path, hw)
    (refused,) = problems
    assert "only the description's numbers differ" in refused
    assert "--allow-other-target" in refused
    monkeypatch.setitem(targets.PREVIOUS_HASHES, "x86_zen4", ("0" * 64,))
    assert logs.manifest_problems(stored, tmp_path, hw) == ([], [])
    # an earlier hash with another TVM target is still another target
    other = {**stored, "target": {**stored["target"], "key": '{"kind":"llvm"}'}}
    assert logs.manifest_problems(other, tmp_path, hw)[1]


def test_copy_probe_measures_a_bandwidth():
    gbs = copy_bandwidth(tf.load_target("host").tvm_target(), 1 << 20, 3, fork_join_us=0.0)
    assert math.isfinite(gbs) and gbs > 0.1


def test_fma_probe_computes_its_chain_and_measures_a_peak():
    import numpy as np
    import tvm

    hw = tf.load_target("host")
    lanes = hw.vector_width_bits // 32
    lib = tvm.compile(_fma_kernel(1, lanes, "float32"), target=hw.tvm_target())
    out = tvm.runtime.tensor(np.zeros((1, FMA_ACCS, lanes), "float32"))
    lib.jit()["fma"](out)
    # every accumulator went x -> 0.999 x + 0.001 FMA_STEPS times from its start j + 1
    want = 1 + np.arange(FMA_ACCS, dtype=np.float64) * 0.999 ** FMA_STEPS
    np.testing.assert_allclose(out.numpy()[0, :, 0], want, rtol=1e-4)
    peaks = fma_peaks(hw.tvm_target(), cores=1, vector_bits=hw.vector_width_bits, repeat=2)
    assert set(peaks) == {"float32", "float64"}
    assert all(math.isfinite(v) and v > 1e8 for v in peaks.values())


def test_what_calibration_cannot_do_is_refused_before_measuring(tmp_path):
    with pytest.raises(TargetError, match="calibrate measures the machine it runs on"):
        check_inputs(tf.load_target("a100"), "x")
    with pytest.raises(TargetError, match="not a plain target name"):
        check_inputs(tf.load_target("x86_zen4"), "a/b")
    with pytest.raises(TargetError, match="must end in .json"):
        write_target({}, tmp_path / "x.txt")
    with pytest.raises(TargetError, match="directory .*nosuch does not exist"):
        write_target({}, tmp_path / "nosuch" / "x.json")


@pytest.mark.parametrize("args,says", [
    (("--target", "a100"), "calibrate measures the machine it runs on"),
    (("-o", "nosuchdir/x.json"), "-o nosuchdir/x.json: directory nosuchdir does not exist"),
])
def test_bad_calibrate_input_is_exit_2_with_one_message(tmp_path, args, says):
    out = cli("calibrate", *args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
