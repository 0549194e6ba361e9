"""The search-space files drive the MetaSchedule design spaces, and bad files are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api as mutator_ffi
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from tvm_fusion.targets import load_target
from tvm_fusion.schedules.cpu_rules import MutateTileChoice, filling_tiles
from tvm_fusion.compat.fast_import import build_kernel
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


def _avx512(host):
    """The register-tile expectations below count AVX-512's 16 lanes and 32 registers."""
    if "avx512f" not in load_target("host").features:
        pytest.skip("this CPU has no AVX-512: the expected tiles are for 16 fp32 lanes and "
                    "32 vector registers")


OUR_RULES = ("plain", "register_tile", "depthwise")


def _stock_doc():
    """The shipped cpu.json without tvm-fusion's own rules: MetaSchedule's default space."""
    doc = _doc()
    doc["rules"] = [r for r in doc["rules"] if r not in OUR_RULES]
    for r in OUR_RULES:
        doc[r] = None
    doc["mutators"] = {"tile_size": 0.9, "compute_location": 0.05, "unroll": 0.03,
                       "parallel": 0.02}
    return doc


def _shape(sch):  # the instructions of a trace, without the sampled decisions
    return [(i.kind.name, str(i.attrs)) for i in sch.trace.insts]


def _tags(sch) -> set[str]:
    return {str(i.inputs[1]).strip('"') for i in sch.trace.insts
            if i.kind.name == "Annotate" and "tvm_fusion." in str(i.inputs[1])}


def test_shipped_cpu_file_matches_metaschedules_default_space(host):
    ours = _design_space(space_generator(space_from_dict(_stock_doc()), host), host)
    stock = _design_space("post-order-apply", host)
    assert len(ours) == len(stock) == 3  # plain, reuse-write at level 1, at level 2

    # same seed: the same instructions, attributes and sampled decisions, the same loops
    assert [str(s.trace) for s in ours] == [str(s.trace) for s in stock]
    assert [str(s.mod) for s in ours] == [str(s.mod) for s in stock]

    # the shipped file keeps those three spaces and adds its rules' spaces next to them
    shipped = _design_space(space_generator(load_search_space("cpu"), host), host)
    plain = [s for s in shipped if not _tags(s)]
    assert sorted(map(_shape, plain)) == sorted(map(_shape, stock))
    assert {frozenset(_tags(s)) for s in shipped if _tags(s)} == {
        frozenset({"tvm_fusion.plain"}),
        frozenset({"tvm_fusion.register_tile", "tvm_fusion.epilogue"})}


def test_changing_knobs_changes_the_generated_schedules(host):
    doc = _stock_doc()  # MetaSchedule's rules alone: their knobs
    doc["tiling"]["max_innermost_factor"] = 4
    doc["parallel_vectorize_unroll"]["unroll_max_steps"] = [0, 8]
    small = _design_space(space_generator(space_from_dict(doc), host), host)
    default = _design_space(space_generator(space_from_dict(_stock_doc()), host), host)

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
    doc = _stock_doc()  # MetaSchedule's rules alone: their knobs
    doc["tiling"]["structure"] = "SRS"
    doc["tiling"]["reuse_write"] = None
    spaces = _design_space(space_generator(space_from_dict(doc), host), host)
    # one space (no reuse-write variants); i and j split in 2 levels, k left whole
    assert len(spaces) == 1
    assert [int(i.attrs[0]) for i in _insts(spaces[0], "SamplePerfectTile")] == [2, 2]
    default = _design_space(space_generator(space_from_dict(_stock_doc()), host), host)
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


# --- tvm-fusion's CPU rules (schedules/cpu_rules.py) ---------------------------------------

def _mm_bias_relu_residual(m=32, k=64, n=64, layout_free=False):
    a = te.placeholder((m, k), name="a")
    w = te.placeholder((k, n), name="w")
    bias = te.placeholder((n,), name="bias")
    res = te.placeholder((m, n), name="res")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r), name="c")
    d = te.compute((m, n), lambda i, j: te.max(c[i, j] + bias[j], 0.0) + res[i, j], name="d")
    func = te.create_prim_func([a, w, bias, res, d]).with_attr("global_symbol", "main")
    if layout_free:  # what prepacking marks: the constant weight may change layout
        func = func.with_attr("layout_free_buffers", [1])

    def ref(a, w, bias, res, _):
        return np.maximum(a @ w + bias, 0) + res
    return tvm.IRModule({"main": func}), ref


def _mm_heads(m=32, k=64, n=64, heads=2):
    """A matmul whose consumer splits heads (reshape + transpose): not at the tile's point."""
    a = te.placeholder((m, k), name="a")
    w = te.placeholder((k, n), name="w")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r), name="c")
    d = n // heads
    t = te.compute((heads, m, d), lambda h, i, e: c[i, h * d + e], name="t")
    func = te.create_prim_func([a, w, t]).with_attr("global_symbol", "main")
    return (tvm.IRModule({"main": func}),
            lambda a, w, _: (a @ w).reshape(m, heads, d).transpose(1, 0, 2))


def _depthwise(c=16, h=8, w=16):
    x = te.placeholder((1, c, h, w), name="x")
    k = te.placeholder((c, 1, 3, 3), name="k")
    y = topi.nn.relu(topi.nn.depthwise_conv2d_nchw(x, k, stride=1, padding=1, dilation=1))
    func = te.create_prim_func([x, k, y]).with_attr("global_symbol", "main")

    def ref(x, k, _):
        p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = sum(p[:, :, dy:dy + h, dx:dx + w] * k[None, :, 0, dy, dx, None, None]
                  for dy in range(3) for dx in range(3))
        return np.maximum(out, 0)
    return tvm.IRModule({"main": func}), ref


def _conv_nchwc(chunks=2, h=4, w=8, lanes=16):
    """A 3x3 conv in NCHW16c / OIHW16o (the planner's blocked layout, groups=1)."""
    ic = chunks * lanes
    x = te.placeholder((1, chunks, h + 2, w + 2, lanes), name="x")
    k = te.placeholder((chunks, ic, 3, 3, lanes), name="k")
    c = te.reduce_axis((0, ic), name="c")
    kh = te.reduce_axis((0, 3), name="kh")
    kw = te.reduce_axis((0, 3), name="kw")
    y = te.compute((1, chunks, h, w, lanes), lambda b, o, oh, ow, ob: te.sum(
        x[b, c // lanes, oh + kh, ow + kw, c % lanes] * k[o, c, kh, kw, ob],
        axis=[c, kh, kw]), name="conv")
    z = topi.nn.relu(y)
    func = te.create_prim_func([x, k, z]).with_attr("global_symbol", "main")

    def ref(x, k, _):
        xc = x.transpose(0, 1, 4, 2, 3).reshape(1, ic, h + 2, w + 2)
        win = np.stack([xc[0, :, dy:dy + h, dx:dx + w] for dy in range(3)
                        for dx in range(3)], 1)  # (ic, 9, h, w)
        out = np.einsum("cthw,octb->obhw", win, k.reshape(chunks, ic, 9, lanes))
        return np.maximum(out.transpose(0, 2, 3, 1)[None], 0)
    return tvm.IRModule({"main": func}), ref


def _silu(n=2048):
    x = te.placeholder((4, n), name="x")
    y = te.compute((4, n), lambda i, j: x[i, j] * te.sigmoid(x[i, j]), name="y")
    func = te.create_prim_func([x, y]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func}), lambda x, _: x / (1 + np.exp(-x))


def _args(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, [int(d) for d in p.ty.shape]).astype("float32")
            for p in mod["main"].params]


def _run(lib, arrays):
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    tensors[-1] = tvm.runtime.tensor(np.zeros_like(arrays[-1]))
    lib(*tensors)
    return tensors[-1].numpy()


def _spaces_of(mod, host, seed=1):
    ctx = ms.TuneContext(mod=mod, target=host, search_strategy="evolutionary", rand_state=seed,
                         space_generator=space_generator(load_search_space("cpu"), host))
    return ctx, ctx.generate_design_space()


def _postprocessed(ctx, sch):
    sch = sch.copy()
    assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
    return sch


@pytest.mark.parametrize("kernel, rule", [(_mm_bias_relu_residual, "register_tile"),
                                          (_conv_nchwc, "register_tile"),
                                          (_mm_heads, "register_tile"),
                                          (_depthwise, "depthwise"),
                                          (_depthwise, "plain"),
                                          (_silu, "plain")])
def test_each_rule_gives_schedules_that_compile_and_match_numpy(host, kernel, rule):
    mod, ref = kernel()
    ctx, spaces = _spaces_of(mod, host)
    mine = [s for s in spaces if f"tvm_fusion.{rule}" in _tags(s)]
    assert mine, f"no {rule} space among {[sorted(_tags(s)) for s in spaces]}"
    assert any(not _tags(s) for s in spaces) or rule == "plain"  # stock spaces stay
    arrays = _args(mod)
    want = ref(*arrays)
    for sch in mine:
        sch = _postprocessed(ctx, sch)
        got = _run(build_kernel(sch.mod, host, None), arrays)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_register_tile_holds_a_vector_fma_tile_with_the_epilogue_at_it(host):
    _avx512(host)
    mod, _ = _mm_bias_relu_residual()
    _, spaces = _spaces_of(mod, host)
    tiles = [s for s in spaces if "tvm_fusion.register_tile" in _tags(s)]
    # 32 rows x 4 vectors, 28 accumulators (32 zmm - 4 spare), fill_percent 50: the
    # fullest tiles hold 16 (8 x 2, 4 x 4); 8 x 1 is dropped (9 loads for 8 FMAs), and
    # 2 x 4 (more vectors than rows)
    assert filling_tiles(32, 4, 8, 28, 50) == [(4, (2, 4)), (8, (2,))]
    assert filling_tiles(14, 16, 8, 28, 50) == [(7, (2, 4))]  # the NCHW16c 1x1 conv
    assert filling_tiles(1, 24, 8, 28, 50) == [(1, (12, 24))]  # one row: still filled
    assert len(tiles) == 2  # one per row count
    cands = sorted(tuple(int(c) for c in i.attrs[0]) for s in tiles
                   for i in _insts(s, "SampleCategorical")
                   if any(i.outputs[0].same_as(x) for sp in _insts(s, "Split")
                          for x in sp.inputs))  # (the unroll depth is one too)
    # NR / lanes: a categorical decision ((2, 4) at MR 4, (2,) at MR 8), and so is the
    # parallel loop's job count, over the tiles that split evenly for every NR: at MR 8
    # the 2 column tiles (2,), at MR 4 (1 column tile at NR 4) the 8 row tiles (2, 4, 8)
    assert cands == [(2,), (2,), (2, 4), (2, 4, 8)]
    lanes = 16  # the host has AVX-512 (DESIGN.md); a 16-lane fp32 vector per FMA
    for sch in tiles:
        update = sch.get_sblock("c_update")
        loops = [sch.get(lp) for lp in sch.get_loops(update)]
        kinds = [str(lp.kind) for lp in loops]
        assert int(loops[-1].extent) == lanes and kinds[-1] == "2"  # vectorized
        assert kinds[-3:-1] == ["3", "3"]  # MR rows and NR / lanes vectors unrolled
        assert loops[-4].loop_var.name == "r"  # the reduction just outside the tile
        assert kinds[0] == "1"  # outer tiles fused and parallel
        # the epilogue (bias + relu + residual) is computed at the tile, inside the
        # same parallel loop, not in a second pass over the output
        epi = sch.get_loops(sch.get_sblock("d"))
        assert sch.get(epi[0]).same_as(loops[0]) and len(epi) > 1


def _resampled(mod, space, seeds):
    """Each design space's instructions replayed with fresh draws, as the search samples."""
    for seed in seeds:
        sch = tvm.s_tir.Schedule(mod, seed=seed)
        tvm.s_tir.schedule.Trace(space.trace.insts, {}).apply_to_schedule(
            sch, remove_postproc=True)
        yield sch


def _tile(sch, block="c_update"):  # (MR, NR / lanes) of a register-tile schedule
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock(block))]
    return int(loops[-3].extent), int(loops[-2].extent)


def _jobs(sch, block="c_update") -> int:  # the extent of the tile's parallel loop
    loop = sch.get(sch.get_loops(sch.get_sblock(block))[0])
    assert str(loop.kind) == "1"  # parallel
    return int(loop.extent)


def test_sampled_register_tiles_fill_the_accumulators_and_match_numpy(host):
    _avx512(host)
    mod, ref = _mm_bias_relu_residual()
    ctx, spaces = _spaces_of(mod, host)
    tiles = [s for s in spaces if "tvm_fusion.register_tile" in _tags(s)]
    drawn = [sch for space in tiles for sch in _resampled(mod, space, range(1, 7))]
    # 16 accumulators is the fullest tile: every draw holds at least half of that
    assert {_tile(s) for s in drawn} <= {(4, 2), (4, 4), (8, 2)}
    assert len({_tile(s) for s in drawn}) == 3  # the decisions are sampled, not fixed
    arrays = _args(mod)
    for sch in drawn[::9]:
        got = _run(build_kernel(_postprocessed(ctx, sch).mod, host, None), arrays)
        np.testing.assert_allclose(got, ref(*arrays), rtol=1e-5, atol=1e-5)
    # every draw runs on all the target's cores (a perfect tile could draw 1 job)
    cores = int(host.attrs["num-cores"])
    assert cores >= 2 and min(_jobs(s) for s in drawn) >= cores
    # the search's mutator redraws NR / lanes among the filling candidates, or the job
    # count: the trace stays valid either way
    mutate = MutateTileChoice()
    four = next(s for s in drawn if _tile(s) == (4, 2))
    mutants = []
    for seed in range(1, 9):
        mutated = mutator_ffi.MutatorApply(mutate, four.trace, seed)
        sch = tvm.s_tir.Schedule(mod)
        mutated.apply_to_schedule(sch, remove_postproc=True)
        mutants.append(sch)
    assert (4, 4) in {_tile(s) for s in mutants}
    assert min(_jobs(s) for s in mutants) >= cores
    # without fill_percent MR and NR / lanes are drawn apart, most tiles far from full
    doc = _doc()
    doc["register_tile"]["fill_percent"] = None
    old_ctx = ms.TuneContext(mod=mod, target=host, search_strategy="evolutionary",
                             rand_state=1, space_generator=space_generator(
                                 space_from_dict(doc), host))
    old = [sch for space in old_ctx.generate_design_space()
           if "tvm_fusion.register_tile" in _tags(space)
           for sch in _resampled(mod, space, range(1, 7))]
    assert sum(mr * nv < 8 for mr, nv in map(_tile, old)) > len(old) // 2


def test_register_tile_records_of_old_and_new_sampling_replay_from_logs(host, tmp_path):
    """A record of the new sampling (a categorical decision) and one tuned with the old
    sampling both go through the logs' JSON and rebuild the same kernel, matching numpy."""
    from tvm_fusion.logs.logdb import LogDatabase
    mod, ref = _mm_bias_relu_residual()
    arrays = _args(mod)
    ctx, spaces = _spaces_of(mod, host)
    new = _postprocessed(ctx, next(s for s in spaces if "tvm_fusion.register_tile" in _tags(s)))
    doc = _doc()
    doc["register_tile"].pop("fill_percent")  # a file written before the knob
    old_ctx = ms.TuneContext(mod=mod, target=host, search_strategy="evolutionary",
                             rand_state=1, space_generator=space_generator(
                                 space_from_dict(doc), host))
    old = _postprocessed(old_ctx, next(s for s in old_ctx.generate_design_space()
                                       if "tvm_fusion.register_tile" in _tags(s)))
    assert not _insts(old, "SampleCategorical") or all(
        int(i.attrs[0][0]) == 0 for i in _insts(old, "SampleCategorical"))  # unroll only
    for name, sch in (("new", new), ("old", old)):
        db = LogDatabase(tmp_path / name, writable=True)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, db.commit_workload(mod), [0.001], host,
            ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
        back = LogDatabase(tmp_path / name).query_schedule(mod, host, "main")
        assert back is not None
        tvm.ir.assert_structural_equal(back.mod, sch.mod)
        np.testing.assert_allclose(_run(build_kernel(back.mod, host, None), arrays),
                                   ref(*arrays), rtol=1e-5, atol=1e-5)


def test_register_tile_composes_with_rewrite_layout(host):
    _avx512(host)
    mod, ref = _mm_bias_relu_residual(layout_free=True)
    ctx, spaces = _spaces_of(mod, host)
    tiles = [s for s in spaces if "tvm_fusion.register_tile" in _tags(s)]
    arrays = _args(mod)
    for sch in tiles:
        sch = _postprocessed(ctx, sch)
        text = sch.mod.script()
        assert "meta_schedule.layout_rewrite_preproc" in text  # the weight is packed
        # ... into NR-column panels: the packed weight's innermost axis is the lanes
        packed = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
        shape = [int(d) for d in packed["main"].params[1].ty.shape]
        assert shape[-1] == 16 and len(shape) > 2
        # with the packing block kept, the kernel takes the weight as given
        got = _run(tvm.tirx.build(sch.mod, target=host), arrays)
        np.testing.assert_allclose(got, ref(*arrays), rtol=1e-5, atol=1e-5)


def test_tuning_with_the_rules_measures_them_and_they_match_numpy(host, tmp_path):
    mod, ref = _mm_bias_relu_residual()
    space = space_generator(load_search_space("cpu"), host)
    strategy = ms.search_strategy.EvolutionarySearch(population_size=32,
                                                     init_min_unmeasured=16,
                                                     genetic_num_iters=1)
    # an earlier tune() in this process may leave handlers MetaSchedule's set-up chokes on
    from tvm_fusion.compat.ms_compat import drop_unnamed_handlers
    drop_unnamed_handlers()
    db = ms.tune_tir(mod, host, str(tmp_path), max_trials_global=8, num_trials_per_iter=8,
                     space=space, strategy=strategy, cost_model="random", seed=3,
                     builder=ms.builder.LocalBuilder(f_build=build_kernel, max_workers=1),
                     runner=ms.runner.LocalRunner(), num_tuning_cores=1)
    records = db.get_all_tuning_records()
    assert len(records) == 8
    ours = [r for r in records if _tags(r) & {"tvm_fusion.register_tile", "tvm_fusion.plain"}]
    assert ours  # the search sampled the rules' spaces and measured them
    best = min(records, key=lambda r: float(np.mean([float(x) for x in r.run_secs])))
    arrays = _args(mod)
    want = ref(*arrays)
    for rec in {id(r): r for r in [best, *ours[:2]]}.values():
        sch = tvm.s_tir.Schedule(mod)
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        np.testing.assert_allclose(_run(build_kernel(sch.mod, host, None), arrays), want,
                                   rtol=1e-5, atol=1e-5)


def test_bad_rule_configs_are_refused_with_the_key_and_the_fix(host):
    doc = _doc()
    doc["register_tile"]["row_limits"] = [8, 40]
    with pytest.raises(SearchSpaceError, match=r"mine\.json: register_tile\.row_limits "
                                               r"\[8, 40\] has \[40\].*use row limits from 1 "
                                               r"to 28"):
        space_from_dict(doc, origin="mine.json")
    doc = _doc()
    doc["register_tile"]["fill_percent"] = 0
    with pytest.raises(SearchSpaceError, match=r"register_tile\.fill_percent must be in "
                                                r"1\.\.100"):
        space_from_dict(doc, origin="mine.json")
    doc = _doc()
    doc["depthwise"]["row_limits"] = []
    with pytest.raises(SearchSpaceError, match="depthwise.row_limits is empty"):
        space_from_dict(doc)
    doc = _doc()
    doc["plain"]["max_unrol_vectors"] = 4  # a typo
    with pytest.raises(SearchSpaceError, match=r"unknown key plain\.'max_unrol_vectors'"):
        space_from_dict(doc)
    doc = _doc()
    doc["rules"].remove("plain")
    with pytest.raises(SearchSpaceError, match=r"sections \['plain'\] are configured but "
                                               "not in 'rules'"):
        space_from_dict(doc)
    doc = _doc("cuda")
    doc["rules"].append("register_tile")
    doc["register_tile"] = _doc()["register_tile"]
    with pytest.raises(SearchSpaceError, match="rule 'register_tile' schedules vector FMAs "
                                               "of LLVM CPUs; a 'cuda' space cannot use it"):
        space_from_dict(doc)
    # AVX2 has 16 vector registers: 16 rows leave no room for the operands
    doc = _doc()
    doc["register_tile"]["row_limits"] = [16]
    avx2 = load_target("x86_avx2").tvm_target()
    with pytest.raises(SearchSpaceError, match="this target has 16 vector registers and "
                                               "spare_registers is 4, which leaves 12"):
        space_generator(space_from_dict(doc), avx2)
    space_generator(space_from_dict(doc), load_target("x86_avx512").tvm_target())  # 32 zmm: fine
