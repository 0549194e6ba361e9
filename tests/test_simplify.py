"""Graph simplification: each rewrite against ONNX Runtime on the original model, with the
op counts it promises; and a transpose/cast-wrapped zoo CNN compiling like the clean one."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from benchmarks.wrapped import wrap_convs
from tvm_fusion import build_graph, compile_model, import_model, plan_fusion, simplify_model
from tvm_fusion import zoo
from tvm_fusion.frontend import import_model as import_unsimplified
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
from tvm_fusion.simplify import SimplifyReport
from tvm_fusion.simplify.block import count_ops

LLVM = tvm.target.Target({"kind": "llvm"})
FOLD_TOL = 1e-5
RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def _w(name, *shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def _run(imported, arrays):
    vm = relax.VirtualMachine(tvm.compile(imported.mod, target=LLVM), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [o.numpy() for o in out] if len(imported.outputs) > 1 else [out.numpy()]


def _check(model, *, exact: bool):
    """Import (simplified), run, compare with ONNX Runtime on the original model.

    ``exact``: the rewrite only removes or moves work, so the simplified module's outputs
    are also bit-for-bit those of the module as converted (TVM's own kernels, e.g. its
    softmax, round differently from ONNX Runtime's, rewrite or not).
    """
    imported = import_model(model)
    arrays = random_inputs(imported.inputs)
    want = run_onnxruntime(model, arrays)
    got = _run(imported, arrays)
    before = _run(imported.unsimplified, arrays)
    for g, w, b in zip(got, want, before):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert max_rel_error(g, w) < FOLD_TOL
        if exact:
            np.testing.assert_array_equal(g, b)
    return imported


# ------------------------------------------------------------------------------ casts
def test_identity_and_round_trip_casts_vanish_exactly():
    nodes = [_n("Cast", ["x"], ["c0"], to=F),              # identity
             _n("Relu", ["c0"], ["r"]),
             _n("Cast", ["r"], ["c1"], to=F),               # identity
             _n("Cast", ["i"], ["w"], to=TensorProto.INT32),  # int8 -> int32 -> int8
             _n("Cast", ["w"], ["n"], to=TensorProto.INT8),
             _n("Add", ["n", "i"], ["s"]),
             _n("Cast", ["j"], ["k"], to=TensorProto.INT8),   # int32 -> int8 narrows:
             _n("Cast", ["k"], ["m"], to=TensorProto.INT32)]  # this pair must stay
    model = _model(nodes, [_vi("x", [2, 3, 4]), _vi("i", [5], TensorProto.INT8),
                           _vi("j", [5], TensorProto.INT32)],
                   [_vi("c1", [2, 3, 4]), _vi("s", [5], TensorProto.INT8),
                    _vi("m", [5], TensorProto.INT32)])
    imported = _check(model, exact=True)
    r = imported.simplified
    assert (r.identity_casts, r.round_trip_casts) == (2, 1)
    assert count_ops(imported.mod, "relax.astype") == 2  # only the narrowing pair
    assert count_ops(imported.mod) == 4  # relu, add, two casts


# ------------------------------------------------------------------------- transposes
def test_transposes_sink_through_elementwise_broadcast_and_reductions_and_cancel():
    # NCHW -> NHWC, NHWC-shaped per-channel constants, a reduction over H and W (axes
    # remapped), softmax over C, back to NCHW: every transpose cancels.
    c = numpy_helper.from_array(RNG.standard_normal((4,)).astype(np.float32), "c")
    nodes = [_n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             _n("Add", ["t", "eps"], ["te"]),  # a rank-0 constant broadcasts in any layout
             _n("Relu", ["te"], ["r"]),
             _n("Mul", ["r", "c"], ["m"]),
             _n("Softmax", ["m"], ["sm"], axis=-1),
             _n("Transpose", ["sm"], ["back"], perm=[0, 3, 1, 2]),
             _n("Transpose", ["x"], ["t2"], perm=[0, 2, 3, 1]),
             _n("ReduceSum", ["t2", "axes"], ["red"], keepdims=0)]
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "axes")
    eps = numpy_helper.from_array(np.array(0.5, np.float32), "eps")
    model = _model(nodes, [_vi("x", [2, 4, 5, 6])],
                   [_vi("back", [2, 4, 5, 6]), _vi("red", [2, 4])], [c, axes, eps])
    imported = _check(model, exact=True)
    r = imported.simplified
    assert (r.transposes_before, r.transposes_after) == (3, 0)
    assert r.transpose_pairs == 1
    assert count_ops(imported.mod, "relax.permute_dims") == 0


def test_nhwc_model_keeps_nhwc_convs_and_drops_every_transpose():
    # A tf2onnx-style NHWC model: Transpose -> Conv -> Transpose around each conv, the
    # rest (bias, relu, residual add) in NHWC.
    w1, w2 = _w("w1", 8, 4, 3, 3), _w("w2", 8, 8, 1, 1)
    b = numpy_helper.from_array(RNG.standard_normal((8,)).astype(np.float32), "b")
    nodes = [_n("Transpose", ["x"], ["a"], perm=[0, 3, 1, 2]),
             _n("Conv", ["a", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             _n("Transpose", ["c1"], ["c1h"], perm=[0, 2, 3, 1]),
             _n("Add", ["c1h", "b"], ["y1"]),
             _n("Relu", ["y1"], ["r1"]),
             _n("Transpose", ["r1"], ["r1c"], perm=[0, 3, 1, 2]),
             _n("Conv", ["r1c", "w2"], ["c2"]),
             _n("Transpose", ["c2"], ["c2h"], perm=[0, 2, 3, 1]),
             _n("Add", ["c2h", "r1"], ["out"])]
    model = _model(nodes, [_vi("x", [1, 6, 6, 4])], [_vi("out", [1, 6, 6, 8])], [w1, w2, b])
    imported = _check(model, exact=False)
    r = imported.simplified
    assert (r.transposes_before, r.transposes_after, r.nhwc_ops) == (4, 0, 2)
    convs = [b.value for b in imported.mod["main"].body.blocks[0].bindings
             if getattr(b.value, "op", None) == tvm.ir.Op.get("relax.nn.conv2d")]
    assert [c.attrs.data_layout for c in convs] == ["NHWC", "NHWC"]


def test_transpose_kept_where_sinking_would_add_one():
    # The transposed tensor meets an untransposed computed one: sinking would need a
    # transpose of the other operand, so nothing moves.
    nodes = [_n("Transpose", ["x"], ["t"], perm=[1, 0]),
             _n("Relu", ["y"], ["ry"]),
             _n("Add", ["t", "ry"], ["out"])]
    model = _model(nodes, [_vi("x", [3, 5]), _vi("y", [5, 3])], [_vi("out", [5, 3])])
    imported = _check(model, exact=True)
    assert imported.simplified.transposes_after == 1


# ---------------------------------------------------------------------------- affine
def test_decomposed_batch_norm_and_div_fold_into_conv_weights():
    # Conv (bias) -> Sub mean -> Mul scale -> Add shift -> Div -> Relu, per channel,
    # as exporters decompose BatchNormalization; plus a spatial (not per-channel) Mul
    # that must stay.
    nodes = [_n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             _n("Sub", ["c", "mean"], ["s"]),
             _n("Mul", ["s", "scale"], ["m"]),
             _n("Add", ["m", "shift"], ["a"]),
             _n("Div", ["a", "div"], ["d"]),
             _n("Relu", ["d"], ["r"]),
             _n("Mul", ["r", "spatial"], ["out"])]
    inits = [_w("w", 6, 3, 3, 3), _w("b", 6), _w("mean", 1, 6, 1, 1),
             _w("scale", 6, 1, 1), _w("shift", 1, 6, 1, 1),
             _w("div", 6, 1, 1, positive=True), _w("spatial", 1, 1, 5, 5)]
    model = _model(nodes, [_vi("x", [2, 3, 5, 5])], [_vi("out", [2, 6, 5, 5])], inits)
    imported = _check(model, exact=False)
    r = imported.simplified
    assert (r.affine_ops_folded, r.affine_chains) == (4, 1)
    # conv, its one bias add, relu, the spatial multiply
    assert count_ops(imported.mod) == 4
    assert count_ops(imported.mod, "relax.multiply") == 1


def test_shared_conv_output_is_not_folded():
    # The conv's output is read twice: folding the Mul would compute the conv twice.
    nodes = [_n("Conv", ["x", "w"], ["c"]),
             _n("Mul", ["c", "s"], ["m"]),
             _n("Add", ["m", "c"], ["out"])]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("out", [1, 4, 4, 4])],
                   [_w("w", 4, 3, 1, 1), _w("s", 1, 4, 1, 1)])
    imported = _check(model, exact=True)
    assert imported.simplified.affine_ops_folded == 0
    assert count_ops(imported.mod, "relax.nn.conv2d") == 1


def test_input_scale_folds_into_conv_and_matmul_affine_into_weights():
    # Backward: a per-input-channel Mul before a conv and before a depthwise conv;
    # forward: MatMul -> Mul -> Add along the output features.
    nodes = [_n("Mul", ["x", "sin"], ["xs"]),
             _n("Conv", ["xs", "w"], ["c"], pads=[1, 1, 1, 1]),
             _n("Mul", ["c", "sdw"], ["cs"]),
             _n("Relu", ["cs"], ["cr"]),
             _n("Mul", ["cr", "sdw2"], ["cr2"]),
             _n("Conv", ["cr2", "wdw"], ["dw"], group=4, pads=[1, 1, 1, 1]),
             _n("Flatten", ["dw"], ["f"]),
             _n("MatMul", ["f", "wm"], ["mm"]),
             _n("Mul", ["mm", "sm"], ["ms"]),
             _n("Add", ["ms", "bm"], ["out"])]
    inits = [_w("sin", 1, 3, 1, 1), _w("w", 4, 3, 3, 3), _w("sdw", 1, 4, 1, 1),
             _w("sdw2", 4, 1, 1), _w("wdw", 4, 1, 3, 3), _w("wm", 64, 5), _w("sm", 5),
             _w("bm", 1, 5)]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("out", [1, 5])], inits)
    imported = _check(model, exact=False)
    r = imported.simplified
    # sin (backward), sdw (forward), sdw2 (backward, depthwise), sm (forward); the Add
    # becomes the matmul's bias
    assert (r.affine_ops_folded, r.affine_chains) == (4, 3)
    assert count_ops(imported.mod, "relax.multiply") == 0


def test_batch_norm_op_folds_with_tvm_pass():
    nodes = [_n("Conv", ["x", "w"], ["c"]),
             _n("BatchNormalization", ["c", "g", "beta", "mu", "var"], ["out"])]
    inits = [_w("w", 4, 3, 3, 3), _w("g", 4), _w("beta", 4), _w("mu", 4),
             _w("var", 4, positive=True)]
    model = _model(nodes, [_vi("x", [1, 3, 6, 6])], [_vi("out", [1, 4, 4, 4])], inits)
    imported = _check(model, exact=False)
    assert imported.simplified.batch_norms_folded == 1
    assert count_ops(imported.mod) == 2  # conv, add


def test_parallel_matmuls_combine_when_asked(tmp_path):
    # Q/K/V: three matmuls of one input; off by default, one wide matmul when asked
    nodes = [_n("MatMul", ["x", w], ["o" + w]) for w in "qkv"]
    nodes += [_n("Add", ["oq", "ok"], ["a"]), _n("Mul", ["a", "ov"], ["out"])]
    model = _model(nodes, [_vi("x", [1, 8, 16])], [_vi("out", [1, 8, 12])],
                   [_w(w, 16, 12) for w in "qkv"])
    assert import_model(model).simplified.matmuls_combined == 0
    combined = simplify_model(import_unsimplified(model), combine_matmul=True)
    assert combined.simplified.matmuls_combined == 2
    assert count_ops(combined.mod, "relax.matmul") == 1
    arrays = random_inputs(combined.inputs)
    (want,) = run_onnxruntime(model, arrays)
    assert max_rel_error(_run(combined, arrays)[0], want) < FOLD_TOL
    # the planner and compile_model take the split it leaves
    module = compile_model(combined, "host").export(tmp_path / "m.so")
    from tvm_fusion import load_module
    assert max_rel_error(load_module(module)(*arrays)[0], want) < FOLD_TOL


def _unrolled_rnn(steps=6, k=24, hidden=16):
    """An RNN exported step by step: ``h = tanh(x_t @ W + h @ U)`` with x_t a Gather of
    the input sequence; every step's input projection reads the same W."""
    nodes, h = [], "h0"
    for t in range(steps):
        nodes += [_n("Gather", ["x", f"i{t}"], [f"x{t}"], axis=0),
                  _n("MatMul", [f"x{t}", "W"], [f"a{t}"]),
                  _n("MatMul", [h, "U"], [f"b{t}"]),
                  _n("Add", [f"a{t}", f"b{t}"], [f"s{t}"]),
                  _n("Tanh", [f"s{t}"], [f"h{t + 1}"])]
        h = f"h{t + 1}"
    nodes.append(_n("Identity", [h], ["out"]))
    inits = [_w("W", k, hidden), _w("U", hidden, hidden), _w("h0", 1, hidden)]
    inits += [numpy_helper.from_array(np.array(t, np.int64), f"i{t}") for t in range(steps)]
    return _model(nodes, [_vi("x", [steps, 1, k])], [_vi("out", [1, hidden])], inits)


def test_shared_weight_matmuls_on_independent_inputs_are_stacked(tmp_path):
    """The six input projections become one (6, 24) @ (24, 16) matmul; the recurrent
    ``h @ U`` products, each on the step before, stay apart; outputs match ONNX Runtime,
    through the plan and build too."""
    model = _unrolled_rnn()
    imported = _check(model, exact=False)
    assert imported.simplified.matmuls_stacked == 5
    assert "stacked 5 shared-weight matmuls" in imported.simplified.summary()
    # h0 @ U is folded at import (h0 is a constant): 5 recurrent products are left
    assert count_ops(imported.mod, "relax.matmul") == 1 + 5
    unstacked = simplify_model(import_unsimplified(model), stack_matmuls=False)
    assert count_ops(unstacked.mod, "relax.matmul") == 6 + 5
    arrays = random_inputs(imported.inputs)
    (want,) = run_onnxruntime(model, arrays)
    module = compile_model(imported, "host").export(tmp_path / "m.so")
    from tvm_fusion import load_module
    assert max_rel_error(load_module(module)(*arrays)[0], want) < FOLD_TOL


def test_a_product_whose_input_needs_another_is_not_stacked_with_it():
    """``y = (x @ W) @ W``: the second product reads the first, so stacking them would be
    a cycle; both stay."""
    nodes = [_n("MatMul", ["x", "W"], ["a"]), _n("MatMul", ["a", "W"], ["out"])]
    model = _model(nodes, [_vi("x", [2, 8])], [_vi("out", [2, 8])], [_w("W", 8, 8)])
    imported = _check(model, exact=True)
    assert imported.simplified.matmuls_stacked == 0
    assert count_ops(imported.mod, "relax.matmul") == 2


def _one_hot_embedding(depth=13, n=8, ids=10):
    """Magika's embedding as jax2tf exports it: ids == arange(depth), cast, @ table."""
    nodes = [_n("Unsqueeze", ["ids", "axis"], ["col"]),
             _n("Equal", ["col", "iota"], ["hot"]),
             _n("Cast", ["hot"], ["hotf"], to=F),
             _n("MatMul", ["hotf", "W"], ["emb"]),
             _n("Relu", ["emb"], ["out"])]
    inits = [_w("W", depth, n), numpy_helper.from_array(np.arange(depth, dtype=np.int32), "iota"),
             numpy_helper.from_array(np.array([2], np.int64), "axis")]
    return _model(nodes, [_vi("ids", [1, ids], TensorProto.INT32)], [_vi("out", [1, ids, n])],
                  inits)


def test_a_one_hot_product_with_a_table_is_a_gather_of_its_rows(tmp_path):
    """The (1, 10, 13) @ (13, 8) product becomes a take of the table's rows; an id
    outside [0, 13) (its one-hot row all zeros) reads the appended zero row; outputs
    match ONNX Runtime exactly, through the plan and build too."""
    model = _one_hot_embedding()
    imported = import_model(model)
    assert imported.simplified.one_hot_gathers == 1
    assert count_ops(imported.mod, "relax.matmul") == 0
    assert count_ops(imported.mod, "relax.take") == 1
    assert "made 1 one-hot matmuls gathers" in imported.simplified.summary()
    ids = np.array([[0, 12, 5, -1, 13, 99, 3, 3, 7, -7]], np.int32)
    (want,) = run_onnxruntime(model, [ids])
    (got,) = _run(imported, [ids])
    assert np.array_equal(got, want) and not got[0, 3].any() and not got[0, 5].any()
    from tvm_fusion import load_module
    module = compile_model(imported, "host").export(tmp_path / "m.so")
    assert np.array_equal(load_module(module)(ids)[0], want)
    # a comparison against anything but arange(depth) is no one-hot: left alone
    bad = _one_hot_embedding()
    bad.graph.initializer[1].CopyFrom(numpy_helper.from_array(
        np.arange(1, 14, dtype=np.int32), "iota"))
    assert import_model(bad).simplified.one_hot_gathers == 0
    assert simplify_model(import_unsimplified(model), one_hot=False).simplified \
        .one_hot_gathers == 0


# ------------------------------------------------------------------- cse, report, api
def test_common_subexpressions_merge_and_report_reads_as_a_sentence():
    nodes = [_n("Cast", ["x"], ["c"], to=F),
             _n("Relu", ["c"], ["a"]), _n("Relu", ["x"], ["b"]),
             _n("Add", ["a", "b"], ["out"])]
    model = _model(nodes, [_vi("x", [3, 4])], [_vi("out", [3, 4])])
    imported = _check(model, exact=True)
    r = imported.simplified
    assert isinstance(r, SimplifyReport) and r.common_subexprs == 1
    assert count_ops(imported.mod) == 2
    assert r.summary() == ("simplified 4 -> 2 ops: removed 1 identity casts, "
                           "merged 1 common subexpressions")
    with pytest.raises(AttributeError):
        r.identity_casts = 0  # frozen


def test_constant_comparisons_fold_in_numpy_not_with_fold_constant():
    # an unrolled loop's counter tests (captcha-crnn: 40 ``less`` after import) sent the
    # module to TVM's FoldConstant, which compiled 200 kernels; numpy folds them, the
    # same values as FoldConstant's, and the Where they select with
    from tvm_fusion.simplify.fold import NumpyFolder, constant_calls

    x = relax.Var("x", relax.TensorType((3, 2), "float32"))
    i, n = relax.const(np.array([1, 5, 3], "int64")), relax.const(np.array([3, 3, 3], "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            ops = [bb.emit(f(i, n)) for f in (relax.op.less, relax.op.less_equal,
                                               relax.op.greater, relax.op.greater_equal,
                                               relax.op.equal, relax.op.not_equal)]
            both = bb.emit(relax.op.logical_and(ops[0], relax.op.logical_not(ops[4])))
            either = bb.emit(relax.op.logical_or(both, ops[2]))
            pick = bb.emit(relax.op.where(relax.op.reshape(either, (3, 1)), x,
                                          relax.const(np.zeros((3, 2), "float32"))))
            out = bb.emit_output(relax.Tuple([pick, *ops, either]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert constant_calls(mod) >= 6
    ours, theirs = NumpyFolder(mod).run(), relax.transform.FoldConstant()(mod)
    assert constant_calls(ours) == 0
    arrays = [RNG.standard_normal((3, 2)).astype(np.float32)]
    run = lambda m: relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in arrays])
    for got, want in zip(run(ours), run(theirs)):
        assert got.numpy().dtype == want.numpy().dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_ops_on_constants_are_computed_at_import_and_counted():
    # an exporter's constant arithmetic (a weight scaled, a shape computed) is no
    # kernel; plan's summary says how many went, not "nothing to simplify"
    from tvm_fusion.simplify import simplify_module

    x = relax.Var("x", relax.TensorType((4, 3), "float32"))
    wv = RNG.standard_normal((4, 3)).astype(np.float32)
    w = relax.const(wv)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w2 = bb.emit(relax.op.multiply(w, relax.const(2.0, "float32")))
            shifted = relax.op.subtract(w2, relax.const(1.0, "float32"))
            out = bb.emit_output(relax.op.add(x, shifted))
        bb.emit_func_output(out)
    mod, report = simplify_module(bb.get())
    assert (report.ops_before, report.ops_after, report.constants_folded) == (3, 1, 2)
    assert report.summary() == "simplified 3 -> 1 ops: computed 2 ops on constants at import"
    a = RNG.standard_normal((4, 3)).astype(np.float32)
    got = relax.VirtualMachine(tvm.compile(mod, target=LLVM), tvm.cpu())["main"](
        tvm.runtime.tensor(a)).numpy()
    np.testing.assert_allclose(got, a + (2 * wv - 1), rtol=1e-6)


def test_dead_ops_are_removed_exactly():
    # an op whose result nothing reads (an exporter's leftover) is not computed
    nodes = [_n("Relu", ["x"], ["out"]), _n("Sigmoid", ["x"], ["unused"]),
             _n("Exp", ["unused"], ["unused2"])]
    model = _model(nodes, [_vi("x", [3, 4])], [_vi("out", [3, 4])])
    imported = _check(model, exact=True)
    before = count_ops(imported.unsimplified.mod)  # the importer may drop some itself
    assert imported.simplified.dead_ops == before - 1 >= 1
    assert count_ops(imported.mod) == 1


def test_simplify_off_keeps_graph_and_hash_changes_only_when_graph_does():
    cast = _model([_n("Cast", ["x"], ["c"], to=F), _n("Relu", ["c"], ["out"])],
                  [_vi("x", [3, 4])], [_vi("out", [3, 4])])
    plain = _model([_n("Relu", ["x"], ["out"])], [_vi("x", [3, 4])], [_vi("out", [3, 4])])
    off = import_model(cast, simplify=False)
    assert off.simplified is None and count_ops(off.mod, "relax.astype") == 1
    on = import_model(cast)
    assert on.model_hash != off.model_hash and on.unsimplified.model_hash == off.model_hash
    # nothing to simplify: the hash (and so the tuning logs) of the model stay
    assert import_model(plain).model_hash == import_unsimplified(plain).model_hash
    assert simplify_model(on) is on  # idempotent on a simplified model


# ------------------------------------------------------------------ the wrapped zoo CNN
@pytest.fixture(scope="module")
def wrapped_cls(zoo_model):
    spec = zoo.ZOO["ppocr-cls"]
    clean = onnx.load(zoo_model("ppocr-cls"))
    wrapped = wrap_convs(clean)
    return clean, wrapped, spec.shapes


def _kernels(model) -> int:
    # compile_model builds one PrimFunc per group of this plan
    return len(plan_fusion(build_graph(model.mod), "host").groups)


def test_wrapped_zoo_cnn_compiles_to_the_clean_models_kernels(wrapped_cls):
    clean, wrapped, shapes = wrapped_cls
    n_conv = sum(n.op_type == "Conv" for n in clean.graph.node)
    model = import_model(wrapped, shapes, name="ppocr-cls-wrapped")
    r = model.simplified
    assert r.identity_casts == 2 * n_conv
    assert (r.transposes_before, r.transposes_after, r.transpose_pairs) == (
        4 * n_conv, 0, 2 * n_conv)
    assert _kernels(model) == _kernels(import_model(clean, shapes))
    arrays = random_inputs(model.inputs)
    np.testing.assert_allclose(_run(model, arrays)[0], run_onnxruntime(wrapped, arrays)[0],
                               rtol=1e-4, atol=1e-5)


def test_logs_tuned_before_simplification_still_deploy(tmp_path):
    # Logs key models by hash; the simplified graph has another hash and other kernels.
    # Logs tuned on the graph as converted deploy that graph, with a warning saying so.
    from tvm_fusion import tune

    model = _model([_n("Cast", ["x"], ["c"], to=F), _n("Relu", ["c"], ["out"])],
                   [_vi("x", [3, 4])], [_vi("out", [3, 4])])
    old = import_model(model, simplify=False)
    tune(old, "host", trials=0, logs=tmp_path, progress=False)
    new = import_model(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = compile_model(new, "host", logs=tmp_path)
    assert any("without graph simplification" in str(w.message) for w in caught)
    assert built.info["model_hash"] == old.model_hash
    assert built.info["logs"]["model_in_manifest"]
    # tuned for the simplified graph too: that entry wins, no warning
    tune(new, "host", trials=0, logs=tmp_path, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_model(new, "host", logs=tmp_path).info["model_hash"] == new.model_hash
