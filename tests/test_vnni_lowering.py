"""Default int8 schedules that must lower (issue 41, part 2).

An int8 T5 encoder (flan-t5-small, dynamically quantized) stopped ``compile`` with TVM's
"variable ax0_ax1_fused_0 has been used before definition": the VNNI default of its
Q/K/V projections ran their epilogue (dequantize, reshape to heads, transpose) at the
register tile with the epilogue's loops fused, which TVM's lowering cannot compact.
Here the same kernel, small, lowers and matches ONNX Runtime; and a default schedule
that does not lower is dropped with a warning naming the kernel, never a failed build.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm

import onnx_cases as oc
from tvm_fusion import compile_model, import_model, load_module, load_target
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime


def _vnni() -> bool:
    return "avx512_vnni" in set(load_target("host").features)


pytestmark = pytest.mark.skipif(not _vnni(), reason="the VNNI default schedules need a CPU "
                                "with avx512_vnni; this one has none")


def _kernels(proto):
    """The imported model's fused kernels as compile plans them, and the host target."""
    from tvm_fusion.plan import plan_model
    from tvm_fusion.tune.schedulable import kernel_module

    hw = load_target("host")
    graph, plan = plan_model(import_model(proto).mod, hw, "cost")
    return kernel_module(graph, plan, prepack=True), hw.tvm_target()


def _output(module, inputs) -> np.ndarray:
    got = module(*inputs)
    return np.asarray(got[0] if isinstance(got, (list, tuple)) else got)


def _scheduled(mod) -> dict:
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs
            and f.attrs.get("tirx.is_scheduled", False)}


def test_a_gemm_whose_epilogue_reshapes_to_heads_lowers_on_vnni_and_matches(tmp_path):
    from tvm_fusion.gpu.schedule import default_cpu_schedule
    from tvm_fusion.tune.vnni import lowering_error

    proto = oc.dynamic_matmul_heads()
    mod, target = _kernels(proto)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no default schedule was dropped
        scheduled = _scheduled(default_cpu_schedule(mod, target))
    heads = [n for n in scheduled if "transpose" in n]
    assert heads, f"the GEMM with the transposing epilogue got no VNNI default: {scheduled}"
    for name in heads:
        assert lowering_error(scheduled[name]) is None
        assert "T_transpose" in scheduled[name].script()  # its epilogue is in the kernel

    model = import_model(proto)
    compiled = compile_model(model, "host", no_record="none")
    assert any(compiled.schedules[n] == "rule default" for n in heads)  # the VNNI one
    module = load_module(compiled.export(tmp_path / "heads.so"))
    inputs = random_inputs(model.inputs, seed=0)
    got = _output(module, inputs)
    want = run_onnxruntime(proto, inputs)[0]
    assert got.shape == (1, 6, 32, 64)
    assert max_rel_error(got, want) < 1e-5


def _fused_epilogue_at(sch, last, tile, producer):
    """The epilogue placement before the fix: its loops fused, then split by 16."""
    from tvm_fusion.tune import vnni

    block = sch.get_sblock(last)
    try:
        sch.reverse_compute_at(block, tile)
        inner = sch.get_loops(block)[1:]
        fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        if int(sch.get(fused).extent) % 16 == 0:
            sch.vectorize(sch.split(fused, [None, 16])[1])
    except Exception:  # noqa: BLE001 - as before: its own parallel loop nest
        vnni.parallel_nest(sch, last)


def test_a_default_schedule_that_does_not_lower_is_dropped_with_a_warning(monkeypatch,
                                                                          tmp_path):
    from tvm_fusion.gpu.schedule import default_cpu_schedule
    from tvm_fusion.tune import vnni
    from tvm_fusion.tune.vnni import lowering_error

    proto = oc.dynamic_matmul_heads()
    mod, target = _kernels(proto)
    monkeypatch.setattr(vnni, "_epilogue_at", _fused_epilogue_at)
    name = next(gv.name_hint for gv in mod.functions if "transpose" in gv.name_hint)
    broken = vnni.schedule_packed_vnni(mod[name])
    assert "used before definition" in lowering_error(broken)  # the T5 encoder's error
    with pytest.warns(UserWarning, match=f"default int8 schedule of kernel {name} does "
                                         "not lower.*used before definition"):
        out = default_cpu_schedule(mod, target)
    assert name not in _scheduled(out)  # left to the schedules of any kernel without one

    # compile goes on: the kernel is built as its plain loops, and the build works
    model = import_model(proto)
    with pytest.warns(UserWarning, match="does not lower"):
        compiled = compile_model(model, "host", no_record="none")
    assert compiled.schedules[name] == "unscheduled"  # its plain loops, named as such
    module = load_module(compiled.export(tmp_path / "heads.so"))
    inputs = random_inputs(model.inputs, seed=0)
    want = run_onnxruntime(proto, inputs)[0]
    assert max_rel_error(_output(module, inputs), want) < 1e-5
