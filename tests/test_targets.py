"""Hardware descriptions: shipped files, host detection, schema errors, plausibility."""

from __future__ import annotations

import json
import numbers

import pytest
import tvm

from tvm_fusion.errors import TargetError
from tvm_fusion.targets import (
    ALLOWED_KEYS,
    EXPECTED_KEYS,
    HW_DIR,
    HardwareTarget,
    format_targets_table,
    list_targets,
    load_target,
)

SHIPPED = ["a100", "h100", "h200", "mi250x", "x86_avx2", "x86_avx512", "x86_emeraldrapids"]


def _export(target: tvm.target.Target) -> dict:
    out = {k: str(v) for k, v in dict(target.export()).items()}
    out.pop("tag", None)
    return out


def test_list_targets_has_shipped_files_and_host():
    names = list_targets()
    assert set(SHIPPED) <= set(names)
    assert names[-1] == "host"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_file_loads_to_valid_tvm_target(name):
    t = load_target(name)
    assert isinstance(t, HardwareTarget) and t.name == name
    target = t.tvm_target()
    assert isinstance(target, tvm.target.Target)
    assert target.kind.name == {"cpu": "llvm", "cuda": "cuda", "rocm": "rocm"}[t.family]


@pytest.mark.parametrize("name,arch", [("a100", "sm_80"), ("h100", "sm_90"), ("h200", "sm_90")])
def test_nvidia_arch(name, arch):
    target = load_target(name).tvm_target()
    assert target.kind.name == "cuda"
    assert str(target.attrs["arch"]) == arch
    assert int(target.attrs["thread_warp_size"]) == 32


def test_a100_equals_tvm_tag():
    assert _export(load_target("a100").tvm_target()) == _export(
        tvm.target.Target("nvidia/nvidia-a100"))


def test_h100_equals_tvm_tag_except_arch_suffix():
    ours = _export(load_target("h100").tvm_target())
    tag = _export(tvm.target.Target("nvidia/nvidia-h100"))
    assert tag.pop("arch") == "sm_90a" and ours.pop("arch") == "sm_90"
    assert ours == tag


def test_mi250x_is_rocm_gfx90a_per_gcd():
    t = load_target("mi250x")
    target = t.tvm_target()
    assert target.kind.name == "rocm"
    assert str(target.attrs["mcpu"]) == "gfx90a"
    assert t.warp_size == 64 and int(target.attrs["thread_warp_size"]) == 64
    assert t.compute_units == 110  # one GCD; the package has 220
    assert "GCD" in t.description


@pytest.mark.parametrize("name,mcpu", [("x86_avx2", "haswell"), ("x86_avx512", "icelake-server"),
                                      ("x86_emeraldrapids", "emeraldrapids")])
def test_x86_mcpu_and_cores(name, mcpu):
    t = load_target(name)
    target = t.tvm_target()
    assert str(target.attrs["mcpu"]) == mcpu
    assert int(target.attrs["num-cores"]) == t.compute_units
    assert t.warp_size == 1 and t.shared_memory_bytes_per_unit == 0


def test_host_is_detected_llvm_with_system_cpu():
    t = load_target("host")
    target = t.tvm_target()
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]) == tvm.get_global_func("target.llvm_get_system_cpu")()
    assert int(target.attrs["num-cores"]) == t.compute_units >= 1
    assert t.vector_width_bits in (128, 256, 512)
    assert t.l1_bytes_per_unit > 0 and t.peak_fp32_flops > 1e9
    # derived from the clock, or the measured number of a shipped file of the same target
    assert t.sources["peak_flops.fp32_vector"].startswith(("derived:", "x86_"))


def test_host_takes_the_measured_numbers_of_a_shipped_file_of_its_target(tmp_path, monkeypatch):
    from tvm_fusion import targets
    from tvm_fusion.logs import manifest as logs

    monkeypatch.setattr(targets, "HW_DIR", tmp_path)  # no shipped file: the estimates
    detected = targets.detect_host.__wrapped__()
    assert detected.launch_overhead_us == 10.0 and detected.previous_hashes == (
        detected.values_hash,)
    doc = json.loads((HW_DIR / "x86_zen4.json").read_text())
    doc["name"] = "x86_mine"
    doc["tvm_config"]["value"] = dict(detected.tvm_config)
    doc["launch_overhead_us"] = {"value": 1.5, "source": "measured (test)"}
    doc["peak_flops"]["fp32_vector"] = {"value": 321e9, "source": "measured (test)"}
    (tmp_path / "x86_mine.json").write_text(json.dumps(doc))
    host = targets.detect_host.__wrapped__()
    assert host.name == "host" and host.compute_units == detected.compute_units
    assert (host.launch_overhead_us, host.peak_fp32_flops) == (1.5, 321e9)
    assert host.sources["launch_overhead_us"] == "x86_mine.json: measured (test)"
    # the same hardware: the hash is unchanged, and logs keyed before still apply
    assert host.hardware_hash == detected.hardware_hash
    assert host.values_hash != detected.values_hash
    before = {"schema": logs.MANIFEST_SCHEMA, "version": logs.MANIFEST_VERSION,
              "tvm": logs.versions()["tvm"],
              "target": {**logs.target_identity(detected),
                         "hardware_hash": detected.values_hash}}
    assert logs.manifest_problems(before, tmp_path, host) == ([], [])
    # another TVM target takes nothing
    doc["tvm_config"]["value"] = {**doc["tvm_config"]["value"], "num-cores": 64}
    (tmp_path / "x86_mine.json").write_text(json.dumps(doc))
    assert targets.detect_host.__wrapped__().launch_overhead_us == 10.0


def test_load_by_path(tmp_path):
    doc = json.loads((HW_DIR / "a100.json").read_text())
    doc["name"] = "my_a100"
    path = tmp_path / "my_a100.json"
    path.write_text(json.dumps(doc))
    t = load_target(path)
    assert t.name == "my_a100" and t.compute_units == 108
    assert load_target(str(path)).hardware_hash == t.hardware_hash


def _write_modified(tmp_path, change) -> str:
    doc = json.loads((HW_DIR / "a100.json").read_text())
    change(doc)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_unknown_key_is_rejected(tmp_path):
    extra = {"value": 4, "source": "x"}
    path = _write_modified(tmp_path, lambda d: d.update(tensor_cores_per_sm=extra))
    with pytest.raises(TargetError) as err:
        load_target(path)
    msg = str(err.value)
    assert "tensor_cores_per_sm" in msg and path in msg and "compute_units" in msg


def test_missing_field_is_rejected(tmp_path):
    path = _write_modified(tmp_path, lambda d: d.pop("llc_bytes"))
    with pytest.raises(TargetError) as err:
        load_target(path)
    msg = str(err.value)
    assert "llc_bytes" in msg and path in msg and "Expected keys" in msg


def test_unknown_peak_dtype_and_missing_source_are_rejected(tmp_path):
    fp4 = {"value": 1.0, "source": "x"}
    path = _write_modified(tmp_path, lambda d: d["peak_flops"].update(fp4_matrix=fp4))
    with pytest.raises(TargetError, match="peak_flops.fp4_matrix"):
        load_target(path)
    path = _write_modified(tmp_path, lambda d: d.update(clock_ghz={"value": 1.41, "source": ""}))
    with pytest.raises(TargetError, match="clock_ghz"):
        load_target(path)
    path = _write_modified(tmp_path, lambda d: d.update(compute_units=108))
    with pytest.raises(TargetError, match="compute_units"):
        load_target(path)


def test_unknown_target_name_lists_known_ones():
    with pytest.raises(TargetError) as err:
        load_target("tpu_v9")
    msg = str(err.value)
    assert "tpu_v9" in msg
    for name in SHIPPED + ["host"]:
        assert name in msg


def test_peak_numbers_are_plausible():
    t = {n: load_target(n) for n in SHIPPED}
    a100, h100, h200, mi = t["a100"], t["h100"], t["h200"], t["mi250x"]
    assert a100.peak_matrix_flops > 10 * a100.peak_fp32_flops
    assert h100.peak_matrix_flops > 10 * h100.peak_fp32_flops
    assert mi.peak_matrix_flops > 4 * mi.peak_fp32_flops
    assert h100.peak_fp32_flops > 3 * a100.peak_fp32_flops
    assert h200.dram_bandwidth_gbs > h100.dram_bandwidth_gbs > a100.dram_bandwidth_gbs
    assert h200.peak_flops == h100.peak_flops
    # fp32 SIMT peak = units x clock x 2 x lanes (64 on A100 SMs, 128 on H100 SMs).
    assert a100.peak_fp32_flops == pytest.approx(108 * 1.41e9 * 2 * 64, rel=0.01)
    assert h100.peak_fp32_flops == pytest.approx(132 * 1.98e9 * 2 * 128, rel=0.01)
    assert mi.peak_fp32_flops == pytest.approx(110 * 1.7e9 * 2 * 64, rel=0.01)
    for cpu in (t["x86_avx2"], t["x86_avx512"], t["x86_emeraldrapids"]):
        lanes = cpu.vector_width_bits // 32
        assert cpu.peak_fp32_flops == pytest.approx(
            cpu.compute_units * cpu.clock_ghz * 1e9 * 2 * 2 * lanes)
        assert cpu.peak_matrix_flops is None
        assert 10 < cpu.dram_bandwidth_gbs < 1000
    for gpu in (a100, h100, h200, mi):
        assert 1000 < gpu.dram_bandwidth_gbs < 10000
        assert gpu.shared_memory_bytes_per_unit >= 64 * 1024
        assert gpu.max_threads_per_block == 1024
    for vnni in (t["x86_avx512"], t["x86_emeraldrapids"]):
        assert vnni.peak_flops["int8_vector"] == pytest.approx(4 * vnni.peak_fp32_flops)


def _assert_numbers_sourced(node, where):
    if isinstance(node, dict) and set(node) == {"value", "source"}:
        assert isinstance(node["source"], str) and node["source"].strip(), where
        return
    if isinstance(node, dict):
        for k, v in node.items():
            _assert_numbers_sourced(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _assert_numbers_sourced(v, f"{where}[{i}]")
    else:
        assert not isinstance(node, numbers.Number), f"unsourced number at {where}"


@pytest.mark.parametrize("name", SHIPPED + ["host"])
def test_every_number_has_a_source(name):
    t = load_target(name)
    doc = t.to_json_dict()
    # measured descriptions (x86_emeraldrapids) also carry the optional calibrate fields
    assert set(EXPECTED_KEYS) <= set(doc) <= set(ALLOWED_KEYS)
    _assert_numbers_sourced(doc, name)
    if name != "host":
        _assert_numbers_sourced(json.loads((HW_DIR / f"{name}.json").read_text()), name)


def test_hash_is_stable_and_ignores_sources():
    a = load_target("a100")
    assert a.hardware_hash == load_target("a100").hardware_hash
    assert a.hardware_hash != load_target("h100").hardware_hash
    doc = a.to_json_dict()
    doc["clock_ghz"]["source"] = "edited citation"
    doc["description"] = "edited"
    from tvm_fusion.targets import target_from_dict

    assert target_from_dict(doc).hardware_hash == a.hardware_hash


def test_summary_table_is_aligned():
    targets = [load_target(n) for n in list_targets()]
    lines = format_targets_table(targets).splitlines()
    assert len(lines) == 2 + len(targets)
    assert lines[0].startswith("name") and set(lines[1]) <= {"-", " "}
    assert "sm_80" in lines[2] and "312.0 TFLOP/s" in lines[2]
    col = lines[0].index("family")
    assert all(line[col - 2:col] == "  " for line in lines[2:])


def test_one_byte_formatter_for_hardware_sizes_and_plans():
    from tvm_fusion.targets import format_bytes

    assert [format_bytes(n) for n in (48 << 10, 1 << 20, 1310720, 164 << 10)] == \
        ["48 KiB", "1 MiB", "1.25 MiB", "164 KiB"]  # hardware sizes stay exact
    assert format_bytes(1234567) == "1.18 MiB" and format_bytes(-640) == "-640 B"
    assert format_bytes(1023 << 10) == "1023 KiB" and format_bytes(5 << 30) == "5 GiB"
