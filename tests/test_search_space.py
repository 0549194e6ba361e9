"""The search-space files drive the MetaSchedule design spaces, and bad files are refused."""

from __future__ import annotations

import json

import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tvm_fusion.targets import load_target
from tvm_fusion.tune.space import (SPACE_DIR, SearchSpaceError, load_search_space,
                                   space_from_dict, space_generator)


def _matmul_relu(n=64):
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    d = te.compute((n, n), lambda i, j: te.max(c[i, j], 0.0), name="d")
    return tvm.IRModule({"main": te.create_prim_func([a, b, d]).with_attr("global_symbol", "main")})


def _design_space(space_gen, target):
    ctx = ms.TuneContext(mod=_matmul_relu(), target=target, space_generator=space_gen,
                         search_strategy="evolutionary", rand_state=1)
    return ctx.generate_design_space()


def _insts(sch, kind):
    return [i for i in sch.trace.insts if i.kind.name == kind]


def _doc(name="cpu"):
    return json.loads((SPACE_DIR / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def host():
    return load_target("host").tvm_target()


def test_shipped_cpu_file_matches_metaschedules_default_space(host):
    ours = _design_space(space_generator(load_search_space("cpu"), host), host)
    stock = _design_space("post-order-apply", host)
    assert len(ours) == len(stock) == 3  # plain, reuse-write at level 1, at level 2

    # same seed: the same instructions, attributes and sampled decisions, the same loops
    assert [str(s.trace) for s in ours] == [str(s.trace) for s in stock]
    assert [str(s.mod) for s in ours] == [str(s.mod) for s in stock]


def test_changing_knobs_changes_the_generated_schedules(host):
    doc = _doc()
    doc["tiling"]["max_innermost_factor"] = 4
    doc["parallel_vectorize_unroll"]["unroll_max_steps"] = [0, 8]
    small = _design_space(space_generator(space_from_dict(doc), host), host)
    default = _design_space(space_generator(load_search_space("cpu"), host), host)

    def tile_limits(spaces):
        return {int(i.attrs[1]) for s in spaces for i in _insts(s, "SamplePerfectTile")}

    def innermost(spaces):  # sampled innermost tile factors
        return [int(s.trace.decisions[i][-1]) for s in spaces
                for i in _insts(s, "SamplePerfectTile")]

    def unroll_choices(spaces):
        return {tuple(int(c) for c in i.attrs[0])
                for s in spaces for i in _insts(s, "SampleCategorical")}

    assert tile_limits(default) == {64} and tile_limits(small) == {4}
    assert max(innermost(small)) <= 4
    assert unroll_choices(default) == {(0, 16, 64, 512)}
    assert unroll_choices(small) == {(0, 8)}


def test_structure_and_reuse_write_shape_the_space(host):
    doc = _doc()
    doc["tiling"]["structure"] = "SRS"
    doc["tiling"]["reuse_write"] = None
    spaces = _design_space(space_generator(space_from_dict(doc), host), host)
    # one space (no reuse-write variants); i and j split in 2 levels, k left whole
    assert len(spaces) == 1
    assert [int(i.attrs[0]) for i in _insts(spaces[0], "SamplePerfectTile")] == [2, 2]
    default = _design_space(space_generator(load_search_space("cpu"), host), host)
    assert len(default) == 3  # SSRSRS: i, j in 4 levels, k in 2
    assert [int(i.attrs[0]) for i in _insts(default[0], "SamplePerfectTile")] == [4, 4, 2]


def test_gpu_files_bind_threads_with_their_warp(host):
    a100 = load_target("a100").tvm_target()
    spaces = _design_space(space_generator(load_search_space("cuda"), a100), a100)
    binds = {str(i.attrs[0]) for s in spaces for i in _insts(s, "Bind")}
    assert {"blockIdx.x", "threadIdx.x"} <= binds
    rocm = load_search_space("rocm")
    assert rocm.thread_binding.warp_size == 64
    assert all(t % 64 == 0 for t in rocm.thread_binding.thread_extents)
    mi250x = load_target("mi250x").tvm_target()
    with pytest.raises(SearchSpaceError, match="'cuda' space cannot schedule .* 'rocm'"):
        space_generator(load_search_space("cuda"), mi250x)
    doc = _doc("rocm")
    doc["thread_binding"]["warp_size"] = 32
    with pytest.raises(SearchSpaceError, match="warp_size is 32 but the target's "
                                               "thread_warp_size is 64"):
        space_generator(space_from_dict(doc, origin="bad.json"), mi250x)
    with pytest.raises(SearchSpaceError, match="cannot schedule"):
        space_generator(load_search_space("cpu"), mi250x)


def test_unknown_and_missing_keys_are_refused_with_key_and_file(tmp_path):
    doc = _doc()
    doc["tiling"]["max_inner_factor"] = 16  # a typo
    bad = tmp_path / "typo.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(SearchSpaceError, match=r"typo\.json: unknown key tiling\."
                                               r"'max_inner_factor'"):
        load_search_space(bad)
    doc = _doc()
    del doc["parallel_vectorize_unroll"]["unroll_max_steps"]
    with pytest.raises(SearchSpaceError, match="missing field parallel_vectorize_unroll."
                                               "'unroll_max_steps'"):
        space_from_dict(doc, origin="x.json")
    doc = _doc()
    doc["vectorise"] = True
    with pytest.raises(SearchSpaceError, match="unknown key 'vectorise'"):
        space_from_dict(doc)


def test_malformed_values_are_refused():
    doc = _doc()
    doc["tiling"]["max_innermost_factor"] = "64"
    with pytest.raises(SearchSpaceError, match="tiling.max_innermost_factor must be int"):
        space_from_dict(doc)
    doc = _doc()
    doc["rules"] = doc["rules"] + ["thread_binding"]  # no thread_binding section on CPU
    with pytest.raises(SearchSpaceError, match=r"rules \['thread_binding'\] have no section"):
        space_from_dict(doc)
    doc = _doc()
    doc["mutators"]["tile_sizes"] = 0.5
    with pytest.raises(SearchSpaceError, match="unknown mutator 'tile_sizes'"):
        space_from_dict(doc)
    doc = _doc()
    doc["tiling"]["reuse_write"]["req"] = "maybe"
    with pytest.raises(SearchSpaceError, match="reuse_write.req must be"):
        space_from_dict(doc)
    with pytest.raises(SearchSpaceError, match="Known: cpu, cuda, rocm"):
        load_search_space("tpu")


def test_tune_uses_the_cpu_file_by_default_and_a_given_file(host, tmp_path):
    from tvm_fusion.tune.driver import _resolve_space

    assert _resolve_space(None, host).family == "cpu"
    assert _resolve_space(None, load_target("a100").tvm_target()) is None  # stock GPU space
    doc = _doc()
    doc["parallel_vectorize_unroll"]["unroll_max_steps"] = [0, 32]
    (tmp_path / "mine.json").write_text(json.dumps(doc))
    space = _resolve_space(str(tmp_path / "mine.json"), host)
    assert space.parallel_vectorize_unroll.unroll_max_steps == (0, 32)
    assert space.origin.endswith("mine.json")
