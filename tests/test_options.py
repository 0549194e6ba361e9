"""PlanOptions, SearchOptions and RpcOptions: validated, frozen, keyword-only, and the
same objects whether built in Python or from the command line's flags."""

from __future__ import annotations

import dataclasses

import pytest

import tvm_fusion as tf
from tvm_fusion.cli import _plan_options, _search_options, build_parser, main
from tvm_fusion.errors import OptionError
from tvm_fusion.kernels import KernelOptions
from tvm_fusion.model_spec import load_model_spec
from tvm_fusion.plan import FusionPlan, plan_model


@pytest.mark.parametrize("cls,field,value,allowed", [
    (tf.PlanOptions, "planner", "greedy", "'fuseops', 'cost'"),
    (tf.PlanOptions, "layout", "nhwc", "'auto', 'nchw', 'nchwc' or 'NCHW{c}c'"),
    (tf.PlanOptions, "combine", "yes", "'auto', 'on', 'off'"),
    (tf.PlanOptions, "resources", "measured", "'auto', 'compiled', 'estimated'"),
    (tf.PlanOptions, "prepack", "on", "None, True, False"),
    (tf.PlanOptions, "group_model", "model.json", "None or a learned group model"),
    (tf.SearchOptions, "measure", "dry", "'device', 'none'"),
    (tf.SearchOptions, "trials_per_batch", 0, "at least 1"),
    (tf.SearchOptions, "seed", 1.5, "a whole number"),
    (tf.SearchOptions, "run_timeout_s", 0, "a positive, finite number of seconds"),
    (tf.SearchOptions, "run_timeout_s", float("inf"), "a positive, finite number"),
    (tf.SearchOptions, "rpc", "127.0.0.1:9190", "None or an RpcOptions"),
    (KernelOptions, "before_simplify", "loud", "'off', 'warn', 'quiet'"),
])
def test_a_bad_value_names_the_field_and_what_it_takes(cls, field, value, allowed):
    with pytest.raises(OptionError) as info:
        cls(**{field: value})
    text = str(info.value)
    assert f"{cls.__name__}.{field} must be" in text and allowed in text and repr(value) in text
    assert info.value.field == field
    assert isinstance(info.value, tf.TvmFusionError) and isinstance(info.value, ValueError)


def test_rpc_options_need_a_host_port_tracker_and_a_key():
    with pytest.raises(OptionError, match=r"RpcOptions.tracker must be HOST:PORT.*'tracker'"):
        tf.RpcOptions(tracker="tracker", key="cpu0")
    with pytest.raises(OptionError, match="RpcOptions.key must be"):
        tf.RpcOptions(tracker="127.0.0.1:9190", key="")
    with pytest.raises(TypeError):  # both are required
        tf.RpcOptions(tracker="127.0.0.1:9190")
    rpc = tf.RpcOptions(tracker="127.0.0.1:9190", key="cpu0")
    assert tf.SearchOptions(rpc=rpc).rpc.allow_remote is False


def test_explicit_blocked_layouts_are_accepted():
    assert tf.PlanOptions(layout="NCHW16c").layout == "NCHW16c"
    with pytest.raises(OptionError, match="layout"):
        tf.PlanOptions(layout="NCHW1c")


@pytest.mark.parametrize("options,field", [
    (tf.PlanOptions(), "layout"), (tf.SearchOptions(), "seed"),
    (tf.RpcOptions(tracker="127.0.0.1:9190", key="cpu0"), "key"),
    (KernelOptions(), "plan_options"),
])
def test_options_are_frozen_and_keyword_only(options, field):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, field, getattr(options, field))
    with pytest.raises(TypeError):
        type(options)(*[getattr(options, f.name) for f in dataclasses.fields(options)])
    assert dataclasses.replace(options) == options
    hash(options)


def test_kernel_options_hold_a_plan_options_and_not_its_fields():
    names = {f.name for f in dataclasses.fields(KernelOptions)}
    assert "plan_options" in names
    assert not names & {f.name for f in dataclasses.fields(tf.PlanOptions)}
    with pytest.raises(OptionError, match="KernelOptions.plan_options must be a PlanOptions"):
        KernelOptions(plan_options={"layout": "nchw"})


def test_plan_model_refuses_a_planner_name_in_place_of_options():
    model = load_model_spec("embedded", None, None)
    with pytest.raises(OptionError, match=r"PlanOptions\(planner='fuseops'\)"):
        plan_model(model.mod, "host", "fuseops")


def _args(*argv):
    return build_parser().parse_args(list(argv))


def test_the_cli_flags_build_the_same_options():
    args = _args("plan", "embedded", "--layout", "nchw", "--combine", "off",
                 "--planner", "fuseops", "--resources", "estimated")
    assert _plan_options(args) == tf.PlanOptions(layout="nchw", combine="off",
                                                 planner="fuseops", resources="estimated")
    args = _args("compile", "embedded", "-o", "m.so", "--no-prepack", "--layout", "nchwc")
    assert _plan_options(args) == tf.PlanOptions(layout="nchwc", prepack=False)
    args = _args("tune", "embedded", "--logs", "logs", "--dry-run", "--seed", "3",
                 "--cost-model", "none", "--search-space", "cpu", "--run-timeout", "5",
                 "--rpc-tracker", "127.0.0.1:9190", "--rpc-key", "cpu0", "--prepack")
    assert _search_options(args) == tf.SearchOptions(
        seed=3, cost_model="none", search_space="cpu", run_timeout_s=5.0, measure="none",
        rpc=tf.RpcOptions(tracker="127.0.0.1:9190", key="cpu0"))
    assert _plan_options(args) == tf.PlanOptions(prepack=True)
    assert _search_options(_args("tune", "embedded", "--logs", "l")) == tf.SearchOptions()
    with pytest.raises(tf.TvmFusionError, match="--rpc-tracker and --rpc-key go together"):
        _search_options(_args("tune", "embedded", "--logs", "l", "--rpc-key", "cpu0"))


def test_cli_plan_with_a_layout_is_the_plan_of_those_options(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "embedded", "--layout", "nchw", "--quiet", "--json", str(out)]) == 0
    capsys.readouterr()
    from_cli = FusionPlan.load(out)
    model = load_model_spec("embedded", None, None)
    _, plan = plan_model(model.mod, "host", tf.PlanOptions(layout="nchw"))
    assert from_cli.hash == plan.hash and from_cli.layout == plan.layout == "NCHW"
    assert [g.nodes for g in from_cli.groups] == [g.nodes for g in plan.groups]


def test_jit_keys_its_cache_on_every_plan_option_set(tmp_path):
    from tvm_fusion.embedded import build_embedded_model

    proto = build_embedded_model()
    sig = [(i.name, tuple(i.shape)) for i in tf.import_model(proto).inputs]
    keys = {tf.jit(proto, cache_dir=tmp_path, plan_options=o).cache_key(sig) for o in (
        tf.PlanOptions(), tf.PlanOptions(planner="fuseops"), tf.PlanOptions(combine="off"),
        tf.PlanOptions(prepack=False), tf.PlanOptions(layout="nchw"))}
    assert len(keys) == 5
