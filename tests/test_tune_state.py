"""TuneState: a committed record that turns out slower than the default gives way to it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te
from tvm.s_tir import meta_schedule as ms

import tvm_fusion as tf
from tvm_fusion.logs.dirs import open_database
from tvm_fusion.tune.state import TuneState
from tvm_fusion.tune.verify import Verdict


def _workload():
    x = te.placeholder((4, 64), "float32", name="x")
    y = te.compute((4, 64), lambda i, j: te.sigmoid(x[i, j]), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y]).with_attr("global_symbol", "main")})


class _GivenTimings:
    """The verifier's side-by-side timing of a record against the default, as given."""

    def __init__(self, record_us, default_us, margin=0.03):
        self.verdict = Verdict(None, record_us, default_us, margin)
        self.checked = []

    def check(self, key, workload, candidate):
        self.checked.append(candidate)
        return self.verdict

    def default_trace(self, key):
        return None  # the default is the kernel's own loops


@pytest.fixture
def state(tmp_path):
    target = tf.load_target("host").tvm_target()
    workload = _workload()
    db = open_database(tmp_path, create=True)
    sch = tvm.s_tir.Schedule(workload)
    _, j = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(j, [None, 16])[1])
    args = ms.arg_info.ArgInfo.from_prim_func(workload["main"])
    db.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, db.commit_workload(workload), [750e-6, 760e-6, 740e-6], target, args))
    task = SimpleNamespace(dispatched=[workload], task_name="sigmoid", weight=1)
    st = TuneState(tasks=[task], target=target, accepted=db, tdir=tmp_path, progress=None,
                   manifest={}, entry={})
    return st, sch.mod


def _deployed(st) -> tvm.IRModule:
    top = st.accepted.get_top_k(st.workloads[0], 1)[0]
    return top.as_measure_candidate().sch.mod


def test_a_record_slower_than_the_default_gives_way_to_it(state):
    st, record = state
    assert st.best[0] == pytest.approx(750.0)
    st.verifier = _GivenTimings(record_us=600.0, default_us=300.0)
    assert st.recheck_record(0)
    # the record itself was timed, and the default (the kernel's own loops) now deploys
    assert tvm_ffi.structural_equal(st.verifier.checked[0], record)
    assert tvm_ffi.structural_equal(_deployed(st), tvm.s_tir.Schedule(_workload()).mod)
    assert st.best[0] == pytest.approx(375.0)  # the record's timings, scaled 300/600
    assert st.defaults_kept == 1
    # read back from disk, the default still ranks first
    again = open_database(st.tdir, create=False)
    top = again.get_top_k(again.commit_workload(_workload()), 1)[0]
    assert np.median([float(s) for s in top.run_secs]) == pytest.approx(375e-6)


@pytest.mark.parametrize("record_us, default_us", [
    (300.0, 600.0),   # the record is faster beyond the noise: it stays
    (600.0, 610.0),   # within the noise, the record measured faster: it stays
])
def test_a_record_faster_than_the_default_stays(state, record_us, default_us):
    st, record = state
    st.verifier = _GivenTimings(record_us=record_us, default_us=default_us)
    assert not st.recheck_record(0)
    assert tvm_ffi.structural_equal(_deployed(st), record)
    assert st.best[0] == pytest.approx(750.0) and st.defaults_kept == 0


def test_a_kernel_that_hangs_is_killed_by_the_runner_and_logged(tmp_path):
    """A kernel that never ends (a loop on an input value) is killed at the run timeout;
    the tuning state logs it to rejected.jsonl as timed out, and the same runner then
    measures the next kernel (its killed worker replaced)."""
    from tvm.script import tirx as T

    from tvm_fusion.tune.measure import local_runner
    from tvm_fusion.tune.progress import Progress

    @T.prim_func
    def hang(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        while a[0] > T.float32(-1e30):  # random inputs are finite: forever
            b[0] = b[0] + T.float32(1)

    target = tf.load_target("host").tvm_target()
    runner = local_runner(timeout_s=1.0)
    inputs = []
    for name, func in (("hang", hang), ("ok", _workload()["main"])):
        lib = tvm.tirx.build(tvm.IRModule({"main": func}), target=target)
        lib.export_library(str(tmp_path / f"{name}.so"))
        inputs.append(ms.runner.RunnerInput(str(tmp_path / f"{name}.so"), "cpu",
                                            ms.arg_info.ArgInfo.from_prim_func(func)))
    hung, ok = (f.result() for f in runner.run(inputs))
    assert hung.run_secs is None and "Timeout, killed after 1.0 seconds" in hung.error_msg
    assert ok.error_msg is None and len(ok.run_secs) > 0  # a new worker measured it

    workload = tvm.IRModule({"main": hang})
    entry = {"trials": 0, "plan": {"hash": "p"}}
    task = SimpleNamespace(dispatched=[workload], task_name="hang", weight=1)
    st = TuneState(tasks=[task], target=target, accepted=open_database(tmp_path, create=True),
                   tdir=tmp_path, progress=Progress(1, enabled=False),
                   manifest={"models": {"m": entry}}, entry=entry)
    cand = ms.MeasureCandidate(tvm.s_tir.Schedule(workload),
                               ms.arg_info.ArgInfo.from_prim_func(hang))
    st.on_batch(None, 0, [cand], [hung])
    assert st.timed_out == [1] and st.best == [None] and entry["trials"] == 1
    (row,) = [json.loads(x) for x in (tmp_path / "rejected.jsonl").read_text().splitlines()]
    assert row["task"] == "hang" and row["timed_out"] is True
    assert "killed after 1.0 seconds" in row["error"] and "--run-timeout" in row["error"]


def _fresh_state(tmp_path, workload, name, baseline=None) -> TuneState:
    """A tuning state of one task with no record yet."""
    from tvm_fusion.tune.progress import Progress

    entry = {"trials": 0, "plan": {"hash": "p"}}
    task = SimpleNamespace(dispatched=[workload], task_name=name, weight=1)
    return TuneState(tasks=[task], target=tf.load_target("host").tvm_target(),
                     accepted=open_database(tmp_path, create=True), tdir=tmp_path,
                     progress=Progress(1, enabled=False), manifest={"models": {"m": entry}},
                     entry=entry, baseline=baseline)


def test_with_no_record_a_candidate_no_faster_than_the_default_makes_the_default_the_record(
        tmp_path):
    """A task with no record whose best candidate of a batch the verifier times no faster
    than the default loops: the default is committed as the record (its run_secs the
    candidate's, scaled by the side-by-side ratio), so compile deploys what measured
    fastest, not a cost-model pick; a later batch must beat it."""
    workload = _workload()
    st = _fresh_state(tmp_path, workload, "sigmoid")
    st.verifier = _GivenTimings(record_us=400.0, default_us=200.0)
    sch = tvm.s_tir.Schedule(workload)
    _, j = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(j, [None, 16])[1])
    cand = ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(workload["main"]))
    result = SimpleNamespace(error_msg=None, run_secs=[500e-6, 510e-6, 490e-6])
    st.on_batch(None, 0, [cand], [result])
    assert st.defaults_kept == 1 and st.best[0] == pytest.approx(250.0)  # 500 x 200/400
    assert tvm_ffi.structural_equal(_deployed(st), tvm.s_tir.Schedule(workload).mod)
    # a later candidate the runner times slower than that record is not even checked
    st.verifier.checked.clear()
    slower = SimpleNamespace(error_msg=None, run_secs=[300e-6] * 3)
    st.on_batch(None, 0, [cand], [slower])
    assert st.verifier.checked == [] and st.defaults_kept == 1


def _matmul_relu():
    a = te.placeholder((64, 64), "float32", name="a")
    w = te.placeholder((64, 64), "float32", name="w")
    k = te.reduce_axis((0, 64), name="k")
    m = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="m")
    y = te.compute((64, 64), lambda i, j: te.max(m[i, j], 0.0), name="y")
    return tvm.IRModule({"main": te.create_prim_func([a, w, y]).with_attr(
        "global_symbol", "main")})


def test_a_record_must_beat_the_rule_default_which_becomes_the_record_where_it_wins(
        tmp_path):
    """On a CPU a build without a record deploys the rules' default schedule, so that,
    not the plain loops, is what tuning times a candidate against: a candidate slower
    than it (here the plain loops themselves) is not committed, and the rule default,
    checked against the reference, becomes the record, which replays its schedule."""
    from tvm_fusion.tune.driver import _baseline, _resolve_space

    target = tf.load_target("host").tvm_target()
    workload = _matmul_relu()
    st = _fresh_state(tmp_path, workload, "mm",
                      baseline=_baseline(_resolve_space(None, target), target))
    plain = ms.MeasureCandidate(tvm.s_tir.Schedule(workload),
                                ms.arg_info.ArgInfo.from_prim_func(workload["main"]))
    result = SimpleNamespace(error_msg=None, run_secs=[1e-3] * 3)
    st.on_batch(None, 0, [plain], [result])
    rule = st.verifier.default_trace(0)
    assert rule is not None and "sch.vectorize" in str(rule)  # a scheduled kernel
    assert st.defaults_kept == 1 and st.best[0] is not None
    deployed = _deployed(st)
    assert not tvm_ffi.structural_equal(deployed, workload)  # not the plain loops
    assert "T.vectorized" in deployed.script() and "T.parallel" in deployed.script()
    # and a record that is the rule default is not re-checked against itself
    assert not st.recheck_record(0)


def test_the_verifier_times_a_kernel_with_its_weights_prepacked_as_the_runner_does(
        monkeypatch):
    """A schedule with a layout rewrite repacks its weights inside the kernel until a
    build prepacks them. MetaSchedule's runner and the deployed module run it without
    the repack, so the side-by-side check times it without too: with the repack PLCMOS'
    1x32x64 GEMV took 965 ns against the runner's 58 ns, the plain loops won, and the
    record kept 4.7 ns (58 ns scaled by that ratio). Correctness is still checked on
    the kernel with its repack, against the reference."""
    from tvm_fusion.tune import verify
    from tvm_fusion.tune.driver import _baseline, _resolve_space

    target = tf.load_target("host").tvm_target()
    func = _matmul_relu()["main"].with_attr("layout_free_buffers", [1])  # w: a weight
    workload = tvm.IRModule({"main": func})
    rule = _baseline(_resolve_space(None, target), target)(workload)
    assert "layout_rewrite_preproc" in rule.mod.script()
    timed = verify.timed_form(rule.mod)  # the weight buffer is the packed one, a param
    assert timed["main"].params[1].name == "w_global"
    packed = [int(d) for d in timed["main"].params[1].shape]
    assert packed != [64, 64] and int(np.prod(packed)) == 64 * 64

    timed_shapes = []
    real = verify._repeats_us

    def spy(rlib, dev, arrays):
        timed_shapes.append([tuple(a.shape) for a in arrays])
        return real(rlib, dev, arrays)

    monkeypatch.setattr(verify, "_repeats_us", spy)
    v = verify.KernelVerifier(target, baseline=_baseline(_resolve_space(None, target),
                                                         target))
    verdict = v.check(0, workload, rule.mod)
    assert verdict.error is None and verdict.candidate_us > 0
    assert timed_shapes and all(s[1] == tuple(packed) for s in timed_shapes)
