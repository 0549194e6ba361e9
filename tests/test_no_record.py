"""Kernels without a tuning record are scheduled at build, with no measurement.

``compile`` without logs, logs that miss kernels and a JIT signature nobody tuned used
to run such kernels as plain loops (a ResNet-50 62x slower than ONNX Runtime). Now a CPU
kernel gets the cost model's pick or the search space's rule default, checked against
the plain kernel's output; a GPU kernel dlight's rules. The search budget is counted in
candidates, not seconds: the same model gives the same schedules on a loaded machine.
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
import tvm
import tvm_ffi

import tvm_fusion as tf
from tvm_fusion.data import shipped_logs_dir
from tvm_fusion.plan import PlanOptions, plan_model
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
from tvm_fusion.targets import as_target
from tvm_fusion.tune import fallback
from tvm_fusion.kernels.schedulable import kernel_module
from tvm_fusion.tune.space import space_for_target, space_generator

from onnx_cases import conv_se_chain


@pytest.fixture(scope="module")
def chain():
    proto = conv_se_chain(channels=16, size=16)
    model = tf.import_model(proto)
    inputs = random_inputs(model.inputs)
    return proto, model, inputs, run_onnxruntime(proto, inputs)


def _kernels(model, hw):
    graph, plan = plan_model(model.mod, hw)
    return plan, kernel_module(graph, plan, prepack=True)


def _schedule(mod, target, **kw):
    gen = space_generator(space_for_target(target), target)
    with target:
        return fallback.schedule_without_records(mod, target, space_generator=gen, **kw)


def test_compile_without_logs_gives_every_cpu_kernel_a_schedule_and_matches_onnxruntime(
        chain, tmp_path):
    _, model, inputs, want = chain
    compiled = tf.compile_model(model, "host", no_record="auto")
    assert set(compiled.schedules) == set(compiled.kernels)
    assert "unscheduled" not in compiled.schedules.values(), compiled.schedules
    assert compiled.info["schedules"] == dict(compiled.schedules)
    got = tf.load_module(compiled.export(tmp_path / "m.so"))(*inputs)
    assert max_rel_error(got[0], want[0]) < 1e-5


def test_plain_loops_stay_available_for_comparison(chain):
    _, model, _, _ = chain
    compiled = tf.compile_model(model, "host", no_record="none")
    assert set(compiled.schedules.values()) == {"unscheduled"}


def test_the_rule_default_of_the_largest_conv_is_parallel_and_vectorized(chain):
    _, model, _, _ = chain
    hw = as_target("host")
    target = hw.tvm_target()
    plan, mod = _kernels(model, hw)
    scheduled, picks = _schedule(mod, target, cost_model=None, search_candidates=0)
    assert picks and {p.kind for p in picks.values()} == {"rule default"}, picks
    convs = {g.name: g.est_us for g in plan.groups if g.name.startswith("fused_conv2d")}
    top = max(convs, key=convs.get)
    func = scheduled[top]
    text = func.script()
    assert "T.parallel" in text and "T.vectorized" in text, top
    assert func.attrs["tirx.is_scheduled"]
    assert "T.parallel" not in mod[top].script()  # it was plain loops


def test_the_shipped_cost_model_picks_within_its_budget_and_the_picks_are_correct(chain):
    """A budget of one kernel's population searches the largest kernel only."""
    proto, model, inputs, want = chain
    hw = as_target("host")
    target = hw.tvm_target()
    path = shipped_logs_dir() / "x86_zen4" / "costmodel.json"
    from tvm_fusion.costmodel import make_cost_model
    cm = make_cost_model(path, hw, update_rounds=0)
    plan, mod = _kernels(model, hw)
    shares = {g.name: g.est_us for g in plan.groups}
    top = max(shares, key=shares.get)
    # a budget that ends after the first kernel: the largest predicted share gets the search
    scheduled, picks = _schedule(mod, target, cost_model=cm,
                                 search_candidates=fallback.SEARCH_POPULATION, shares=shares)
    assert picks[top].kind == "predicted", picks
    same = tvm_ffi.structural_hash(fallback._workload(mod[top]))
    for n, p in picks.items():  # the rest (but a repeat of the top kernel) were not searched
        repeat = tvm_ffi.structural_hash(fallback._workload(mod[n])) == same
        assert p.kind == ("predicted" if repeat else "rule default"), (n, p)


def _slow_clock(monkeypatch):
    """time.monotonic as on a machine so loaded that every call is 1000 s later."""
    ticks = itertools.count(start=time.monotonic(), step=1000.0)
    monkeypatch.setattr(time, "monotonic", lambda: next(ticks))


def test_the_search_budget_is_counted_in_candidates_largest_share_first(monkeypatch):
    """Each kernel is searched with a population of SEARCH_POPULATION candidates (the
    last with what is left) until the budget is spent, however long the search takes."""
    from tvm import te

    def kernel(n: int) -> tvm.tirx.PrimFunc:
        a = te.placeholder((n,), "float32", name="a")
        return te.create_prim_func([a, te.compute((n,), lambda i: a[i] * 2.0, name="b")])

    mod = tvm.IRModule({f"k{n}": kernel(n) for n in (16, 32, 64, 128)})
    name = {tvm_ffi.structural_hash(fallback._workload(f)): gv.name_hint
            for gv, f in mod.functions.items()}
    searched = []

    def search(wl, target, gen, cm, population, seed):
        searched.append((name[tvm_ffi.structural_hash(wl)], population))
        return []

    monkeypatch.setattr(fallback, "_search_pick", search)
    monkeypatch.setattr(fallback, "_rule_option", lambda *a: [])
    _slow_clock(monkeypatch)
    target = as_target("host").tvm_target()
    pop = fallback.SEARCH_POPULATION
    fallback.schedule_without_records(
        mod, target, space_generator=None, cost_model=object(), check=False,
        search_candidates=2 * pop + 5,
        shares={"k16": 1.0, "k32": 4.0, "k64": 2.0, "k128": 3.0})
    assert searched == [("k32", pop), ("k128", pop), ("k64", 5)]


def test_auto_gives_the_same_schedules_however_slow_the_machine(chain, monkeypatch):
    """Two builds of one model pick the same kind and the same schedule for every kernel,
    the second on a clock that jumps 1000 s per reading: the 20 s clock budget searched
    the largest kernels on a quiet machine and none past the first on a loaded one (and
    its check skipped the references), so builds differed with the load."""
    from tvm_fusion.deploy import build

    _, model, _, _ = chain
    # the shipped model (the suite's default is none), and a short search: 3 kernels
    monkeypatch.setenv("TVM_FUSION_COST_MODEL",
                       str(shipped_logs_dir() / "x86_zen4" / "costmodel.json"))
    monkeypatch.setattr(fallback, "SEARCH_POPULATION", 8)
    scripts = []

    def recorded(mod, target, **kw):
        out, picks = fallback.schedule_without_records(mod, target, **kw)
        scripts.append({n: out[n].script() for n in picks if n in out})
        return out, picks

    monkeypatch.setattr(build, "schedule_without_records", recorded)
    builds = []
    for slow in (False, True):
        if slow:
            _slow_clock(monkeypatch)
        compiled = tf.compile_model(model, "host", no_record="auto", no_record_budget=20)
        builds.append((dict(compiled.schedules), compiled.info["schedule_notes"]))
    assert builds[0] == builds[1]
    assert scripts[0] == scripts[1]
    kinds = list(builds[0][0].values())
    assert kinds.count("predicted") >= 2 and "rule default" in kinds, builds[0]
    assert not any("not checked" in note for note in builds[0][1].values()), builds[0][1]


def test_a_wrong_pick_is_caught_by_the_check():
    """A pick whose outputs differ from the plain kernel's is rejected; a right one is not."""
    from tvm import te

    def kernel(add: float) -> tvm.IRModule:
        a = te.placeholder((64,), "float32", name="a")
        b = te.compute((64,), lambda i: a[i] + tvm.tirx.const(add, "float32"), name="b")
        return tvm.IRModule({"main": te.create_prim_func([a, b])})

    plain = kernel(1.0)
    sch = tvm.s_tir.Schedule(plain)
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    _, inner = sch.split(loop, [None, 16])
    sch.vectorize(inner)
    target = as_target("host").tvm_target()
    assert fallback._check({"k": sch.mod}, {"k": plain}, target) == {}
    assert fallback._check({"k": kernel(2.0)}, {"k": plain}, target) == {
        "k": "outputs differ from the unscheduled kernel"}
    # a pick that does not lower (a variable no argument defines) is named, the rest run
    a = te.placeholder((64,), "float32", name="a")
    free = te.compute((64,), lambda i: a[i] + tvm.tirx.Var("free", "float32"), name="b")
    unbuildable = tvm.IRModule({"main": te.create_prim_func([a, free])})
    bad = fallback._check({"k": unbuildable, "j": kernel(1.0)}, {"k": plain, "j": plain},
                          target)
    assert list(bad) == ["k"] and bad["k"].startswith("does not build: ") and "free" in bad["k"]


def test_a_jit_signature_without_records_gets_scheduled_kernels(chain, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("TVM_FUSION_NO_RECORD", "auto")  # the suite's default is plain loops
    proto, _, inputs, want = chain
    fn = tf.jit(proto, target="host", cache_dir=tmp_path)
    got = fn(*inputs)
    assert max_rel_error(got[0], want[0]) < 1e-5
    (event,) = fn.events
    kinds = json.loads(event.path.with_name(event.path.name + ".json").read_text())["schedules"]
    assert kinds and "unscheduled" not in kinds.values(), kinds


def test_cli_compile_says_which_kernel_got_which_kind(tmp_path):
    import subprocess
    import sys
    so = tmp_path / "m.so"
    proc = subprocess.run([sys.executable, "-m", "tvm_fusion", "compile", "embedded", "-o",
                           str(so), "--no-record", "auto"], capture_output=True, text=True,
                          check=True)
    assert "schedules: " in proc.stdout and "rule default" in proc.stdout
    info = json.loads(so.with_name(so.name + ".json").read_text())
    assert set(info["schedules"].values()) <= {"rule default", "predicted"}
    help_text = subprocess.run([sys.executable, "-m", "tvm_fusion", "compile", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "--no-record-budget CANDIDATES" in help_text and "not seconds" in help_text


def test_a_kernel_that_would_divide_by_zero_on_random_inputs_is_not_run():
    """Random integer inputs are zeros: a division by one (a strided slice's shape
    function) killed the suite's process with SIGFPE. Such a pick is used unchecked."""
    from tvm import te

    a = te.placeholder((8,), "int64", name="a")
    c = te.placeholder((1,), "int64", name="c")
    b = te.compute((8,), lambda i: tvm.tirx.floordiv(a[i], c[0]), name="b")
    mod = tvm.IRModule({"main": te.create_prim_func([a, c, b])})
    assert fallback._may_trap(mod["main"]) == "an integer division by a run-time value"
    checker = fallback._Checker({"k": mod}, as_target("host").tvm_target(), 1e12)
    assert checker.check({"k": mod}) == {} and checker.unchecked == {"k"}
    b2 = te.compute((8,), lambda i: tvm.tirx.floordiv(a[i], 4), name="b")
    assert fallback._may_trap(te.create_prim_func([a, b2])) is None


def test_a_max_reduction_is_never_unrolled_past_32_by_a_pick():
    """LLVM did not finish building a DynamicQuantizeLinear max reduction of the int8 T5
    encoder unrolled explicitly by 64 (400 s; 0.14 s at 32): such picks are left out."""
    from tvm import te

    a = te.placeholder((32, 512), "float32", name="a")
    k = te.reduce_axis((0, 512), name="k")
    m = te.compute((32,), lambda i: te.max(a[i, k], axis=k), name="m")
    wl = tvm.IRModule({"main": te.create_prim_func([a, m])})
    target = as_target("host").tvm_target()
    gen = space_generator(space_for_target(target), target)
    with target:
        spaces = fallback._design_spaces(wl, target, gen, 0)
    assert spaces and not any(fallback._may_hang_llvm(s.mod["main"]) for s in spaces)


def test_a_wrong_pick_of_a_quantizing_kernel_is_caught_at_a_large_scale():
    """A fake quantize at scale 15.3 (a QDQ ResNet-50's) rounds a standard normal draw to
    zeros: a pick that gave 16 channels the first one's value passed the check, and the
    NCHW int8 ResNet-50 came out 111 steps off. The check's odd draw spans 0.1 .. 1000."""
    from tvm import te

    def kernel(wrong: bool) -> tvm.IRModule:
        x = te.placeholder((4, 64), "float32", name="x")
        s = tvm.tirx.const(15.3, "float32")

        def at(i, c):
            return x[i, c - c % 16] if wrong else x[i, c]

        y = te.compute((4, 64), lambda i, c: te.max(te.min(
            te.round(at(i, c) / s), tvm.tirx.const(127.0, "float32")),
            tvm.tirx.const(-128.0, "float32")) * s, name="y")
        return tvm.IRModule({"main": te.create_prim_func([x, y])})

    target = as_target("host").tvm_target()
    plain = kernel(False)
    assert fallback._check({"k": plain}, {"k": plain}, target) == {}
    assert fallback._check({"k": kernel(True)}, {"k": plain}, target) == {
        "k": "outputs differ from the unscheduled kernel"}


def test_a_max_pool_gets_a_parallel_vectorized_schedule():
    """TOPI marks a pool's block with a MetaSchedule rule TVM 0.27 does not register
    (meta_schedule.pool_max): every other rule skipped it, and a max pool ran as plain
    loops in tuning and without records."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, 64, 64), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2),
                                           padding=(1, 1, 1, 1), layout="NHWC"))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    (name,) = [gv.name_hint for gv, f in mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc)]
    wl = tvm.IRModule({"main": mod[name]})
    target = as_target("host").tvm_target()
    gen = space_generator(space_for_target(target), target)
    scheduled, picks = fallback.schedule_without_records(
        tvm.IRModule({name: mod[name]}), target, space_generator=gen, cost_model=None,
        search_candidates=0)
    assert picks[name].kind == "rule default", picks
    text = scheduled[name].script()
    assert "T.parallel" in text and "T.vectorized" in text
    assert "T.parallel" not in wl["main"].script()


def test_a_pad_of_the_high_edge_is_no_conv_epilogue_and_every_kernel_is_scheduled(tmp_path):
    """TVM marks a pad of the high edge only elementwise (it reads A[i] for each output
    i, guarded): the planner made it a conv's epilogue, where computed at the conv's tile
    it leaves its border unwritten, so the rule default was wrong and the kernel ran as
    plain loops (PP-OCRv6 rec's two stem kernels). It is the next conv's prologue now."""
    from onnx_cases import conv_relu_end_pad
    proto = conv_relu_end_pad()
    model = tf.import_model(proto)
    graph, plan = plan_model(model.mod, "host", PlanOptions(layout="nchw"))  # PP-OCRv6's stem
    pad = next(g for g in plan.groups if any(o.startswith("pad") for o in g.ops))
    assert pad.ops == ("pad#3", "conv2d1#4"), plan.explain("pad#3")
    compiled = tf.compile_model(model, "host", no_record="auto",
                                plan_options=PlanOptions(layout="nchw"))
    assert "unscheduled" not in compiled.schedules.values(), compiled.schedules
    inputs = random_inputs(model.inputs, seed=4)
    got = tf.load_module(compiled.export(tmp_path / "m.so"))(*inputs)
    assert max_rel_error(got[0], run_onnxruntime(proto, inputs)[0]) < 1e-5
