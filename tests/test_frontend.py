"""The ONNX frontend: shape fixing and folding, its errors, and real exported models."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_fusion import zoo
from tvm_fusion.errors import (MissingShapeError, ModelImportError, TvmFusionError,
                               UnsupportedOpError)
from tvm_fusion.frontend import ImportedModel, TensorInfo, import_model, parse_shape
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime

LLVM = tvm.target.Target({"kind": "llvm"})
TOL = 1e-4


# --------------------------------------------------------------------------- graphs
def _model(nodes, inputs, outputs, inits=(), check=True) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    return model


def _c(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _vi(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=outs[0] + "_node", **attrs)


def reshape_from_shape_subgraph():
    """Paddle export: Shape -> Cast -> Slice -> Cast -> Concat feeds Reshape."""
    nodes = [
        _n("Shape", ["x"], ["s"]), _n("Cast", ["s"], ["s32"], to=TensorProto.INT32),
        _n("Slice", ["s32", "st", "en"], ["n32"]), _n("Cast", ["n32"], ["n"], to=TensorProto.INT64),
        _n("Concat", ["n", "tail"], ["ns"], axis=0), _n("Reshape", ["x", "ns"], ["r"]),
        _n("Relu", ["r"], ["y"]),
    ]
    return _model(nodes, [_vi("x", ["N", 4, "H", "W"])], [_vi("y", [None] * 3)],
                  [_c("st", [0]), _c("en", [1]), _c("tail", [-1, 6])])


def pad_from_shape_subgraph():
    """Pads that round H and W up to a multiple of 8, computed from Shape."""
    nodes = [
        _n("Shape", ["x"], ["s"]), _n("Slice", ["s", "two", "four"], ["hw"]),
        _n("Mod", ["hw", "eight"], ["m"]), _n("Sub", ["eight", "m"], ["p0"]),
        _n("Mod", ["p0", "eight"], ["p"]), _n("Concat", ["zeros6", "p"], ["pads"], axis=0),
        _n("Pad", ["x", "pads"], ["y"], mode="constant"),
    ]
    return _model(nodes, [_vi("x", [1, 3, "H", "W"])], [_vi("y", [None] * 4)],
                  [_c("two", [2]), _c("four", [4]), _c("eight", [8]), _c("zeros6", [0] * 6)])


def yolo_grid():
    """YOLO-style cell grid from Range/Expand over the feature map's H and W."""
    nodes = [
        _n("Shape", ["x"], ["s"]), _n("Gather", ["s", "i2"], ["h"], axis=0),
        _n("Gather", ["s", "i3"], ["w"], axis=0),
        _n("Range", ["zero", "h", "one"], ["ys"]), _n("Range", ["zero", "w", "one"], ["xs"]),
        _n("Unsqueeze", ["h", "ax0"], ["h1"]), _n("Unsqueeze", ["w", "ax0"], ["w1"]),
        _n("Concat", ["h1", "w1"], ["hw"], axis=0),
        _n("Unsqueeze", ["ys", "ax1"], ["ys2"]), _n("Unsqueeze", ["xs", "ax0"], ["xs2"]),
        _n("Expand", ["ys2", "hw"], ["yv"]), _n("Expand", ["xs2", "hw"], ["xv"]),
        _n("Unsqueeze", ["xv", "axm"], ["xv3"]), _n("Unsqueeze", ["yv", "axm"], ["yv3"]),
        _n("Concat", ["xv3", "yv3"], ["g"], axis=-1),
        _n("Cast", ["g"], ["gf"], to=TensorProto.FLOAT),
        _n("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]), _n("Add", ["xt", "gf"], ["y"]),
    ]
    return _model(nodes, [_vi("x", [1, 2, "H", "W"])], [_vi("y", [None] * 4)],
                  [_c("i2", 2), _c("i3", 3), _c("zero", 0), _c("one", 1),
                   _c("ax0", [0]), _c("ax1", [1]), _c("axm", [-1])])


def reshape_minus_one_after_transpose():
    """Flatten the trailing dims of a transposed tensor: Reshape to (B, T, -1)."""
    weight = np.random.default_rng(0).standard_normal((32, 5))
    nodes = [
        _n("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]), _n("Shape", ["t"], ["s"]),
        _n("Cast", ["s"], ["s32"], to=TensorProto.INT32),
        _n("Slice", ["s32", "st", "en"], ["bt32"]),
        _n("Cast", ["bt32"], ["bt"], to=TensorProto.INT64),
        _n("Concat", ["bt", "m1"], ["shp"], axis=0), _n("Reshape", ["t", "shp"], ["r"]),
        _n("MatMul", ["r", "w"], ["y"]),
    ]
    return _model(nodes, [_vi("x", ["B", 4, "T", 8])], [_vi("y", [None] * 3)],
                  [_c("st", [0]), _c("en", [2]), _c("m1", [-1]), _c("w", weight, np.float32)])


def dynamic_batch():
    rng = np.random.default_rng(1)
    nodes = [_n("MatMul", ["x", "w"], ["m"]), _n("Add", ["m", "b"], ["a"]),
             _n("Relu", ["a"], ["y"])]
    return _model(nodes, [_vi("x", ["batch", 16])], [_vi("y", ["batch", 8])],
                  [_c("w", rng.standard_normal((16, 8)), np.float32),
                   _c("b", rng.standard_normal(8), np.float32)])


def _stock_import(model, shapes=None):
    """TVM's own importer, quietly (it prints and warns a lot on failure)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return from_onnx(model, shape_dict=shapes)


def _run_tvm(imported: ImportedModel, arrays) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(imported.mod, target=LLVM), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [o.numpy() for o in out] if len(imported.outputs) > 1 else [out.numpy()]


# ------------------------------------------------------------- folding makes it work
# (builder, shapes, stock error unfixed, stock error given shape_dict, ops left after
# folding); an error is (type, message pattern), None where the stock importer works.
RESHAPE_ERR = (TypeError, "Reshape requires the input new shape to be Shape")
SHAPE_EXPR_ERR = (ValueError, "cannot handle ShapeExpr inputs")
CASES = {
    "reshape-shape-subgraph": (reshape_from_shape_subgraph, {"x": (2, 4, 3, 4)},
                               RESHAPE_ERR, RESHAPE_ERR, ["Reshape", "Relu"]),
    "pad-computed": (pad_from_shape_subgraph, {"x": (1, 3, 13, 10)},
                     SHAPE_EXPR_ERR, SHAPE_EXPR_ERR, ["Pad"]),
    "yolo-grid": (yolo_grid, {"x": (1, 2, 5, 7)},
                  None, (ValueError, "Cannot use and / or / not operator"), ["Transpose", "Add"]),
    "reshape-after-transpose": (reshape_minus_one_after_transpose, {"x": (2, 4, 3, 8)},
                                RESHAPE_ERR, RESHAPE_ERR, ["Transpose", "Reshape", "MatMul"]),
    "dynamic-batch": (dynamic_batch, {"x": (3, 16)}, None, None, ["MatMul", "Add", "Relu"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_shapes_and_folding_make_model_importable(case):
    build, shapes, err_unfixed, err_fixed, ops_left = CASES[case]
    model = build()
    for err, shape_dict in ((err_unfixed, None),
                            (err_fixed, {k: list(v) for k, v in shapes.items()})):
        if err is not None:
            with pytest.raises(err[0], match=err[1]):
                _stock_import(model, shape_dict)

    imported = import_model(model, shapes, name=case)
    assert [n.op_type for n in imported.onnx_model.graph.node] == ops_left
    assert imported.inputs == (TensorInfo("x", shapes["x"], "float32"),)
    assert all(-1 not in o.shape for o in imported.outputs)

    arrays = random_inputs(imported.inputs, seed=3)
    got = _run_tvm(imported, arrays)
    want_folded = run_onnxruntime(imported.onnx_model, arrays)
    want_original = run_onnxruntime(model, arrays)
    for g, a, b, info in zip(got, want_folded, want_original, imported.outputs):
        assert g.shape == info.shape
        assert max_rel_error(g, a) <= TOL
        assert max_rel_error(g, b) <= TOL


def test_big_constants_stay_ops_and_constant_outputs_stay_outputs():
    nodes = [_n("Shape", ["x"], ["s"]),
             _n("ConstantOfShape", ["s"], ["ones"],
                value=numpy_helper.from_array(np.ones(1, np.float32))),
             _n("Add", ["x", "ones"], ["y"]), _n("Cast", ["s"], ["sf"], to=TensorProto.FLOAT)]
    model = _model(nodes, [_vi("x", ["N", 1024, 300])],
                   [_vi("y", [None] * 3), _vi("sf", [3]), _vi("s", [3], TensorProto.INT64)])
    imported = import_model(model, {"x": (1, 1024, 300)})
    # 307200 ones would bloat the model: ConstantOfShape stays, fed by a folded shape.
    assert [n.op_type for n in imported.onnx_model.graph.node] == [
        "Constant", "Constant", "ConstantOfShape", "Add"]
    assert [(o.name, o.shape) for o in imported.outputs] == [
        ("y", (1, 1024, 300)), ("sf", (3,)), ("s", (3,))]
    arrays = random_inputs(imported.inputs)
    got = _run_tvm(imported, arrays)
    assert got[2].tolist() == [1, 1024, 300] and got[1].dtype == np.float32
    for g, want in zip(got, run_onnxruntime(model, arrays)):
        assert max_rel_error(g, want) == 0.0


def test_static_inputs_need_no_shapes_and_hash_tracks_shapes(tmp_path):
    path = tmp_path / "reshape.onnx"
    onnx.save(reshape_minus_one_after_transpose(), path)
    a = import_model(path, {"x": (2, 4, 3, 8)})
    b = import_model(path.read_bytes(), {"x": [2, 4, 3, 8]}, name="same")
    c = import_model(str(path), {"x": (1, 4, 5, 8)})
    assert a.source == str(path) and b.source == "same"
    assert a.model_hash == b.model_hash != c.model_hash
    # Once fixed, the folded model has static inputs and imports with no shapes at all.
    again = import_model(a.onnx_model)
    assert again.inputs == a.inputs and again.outputs == a.outputs == (
        TensorInfo("y", (2, 3, 5), "float32"),)


# ------------------------------------------------------------------------ errors
def test_missing_shape_names_input_and_syntax():
    with pytest.raises(MissingShapeError) as err:
        import_model(dynamic_batch(), name="mlp")
    msg = str(err.value)
    assert "x: dims (batch, 16)" in msg
    assert "--shape NAME=D1,D2,..." in msg and "--shape x=D1,16" in msg
    assert 'shapes={"x": (1, 3, 224, 224)}' in msg


def test_unsupported_ops_are_all_listed():
    nodes = [_n("FancyOp", ["x"], ["a"]), _n("Relu", ["a"], ["b"]),
             _n("WeirdOp", ["b"], ["c"]), _n("FancyOp", ["c"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])], check=False)
    with pytest.raises(UnsupportedOpError) as err:
        import_model(model)
    msg = str(err.value)
    assert "FancyOp: 2 node(s), e.g. 'a_node'" in msg
    assert "WeirdOp: 1 node(s), e.g. 'c_node'" in msg
    assert "Relu" not in msg


def test_converter_failure_names_the_node():
    # A reshape target that is a runtime input can never be static.
    nodes = [_n("Reshape", ["x", "shape"], ["y"])]
    model = _model(nodes, [_vi("x", [2, 6]), _vi("shape", [2], TensorProto.INT64)],
                   [_vi("y", [None, None])])
    with pytest.raises(ModelImportError, match="failed on node 'y_node' \\(Reshape\\)"):
        import_model(model)


def test_not_onnx_and_missing_files(tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("these are release notes, not a model\n" * 20)
    with pytest.raises(ModelImportError, match="is not an ONNX model") as err:
        import_model(text)
    assert str(text) in str(err.value)
    missing = tmp_path / "absent.onnx"
    with pytest.raises(ModelImportError, match="not found") as err:
        import_model(missing)
    assert str(missing) in str(err.value)


def test_shape_for_unknown_input_lists_real_inputs():
    with pytest.raises(ModelImportError) as err:
        import_model(dynamic_batch(), {"x": (2, 16), "images": (1, 3, 8, 8)})
    msg = str(err.value)
    assert "'images', which is not an input" in msg and "x: (batch, 16) float32" in msg


def test_shape_that_contradicts_the_file():
    with pytest.raises(ModelImportError, match="does not fit its dims"):
        import_model(dynamic_batch(), {"x": (2, 15)})
    with pytest.raises(ModelImportError, match="does not fit its dims"):
        import_model(dynamic_batch(), {"x": (2, 16, 1)})


def test_parse_shape():
    assert parse_shape("x=1,3,224,224") == ("x", (1, 3, 224, 224))
    assert parse_shape(" input_ids = 1, 128 ") == ("input_ids", (1, 128))
    assert parse_shape("sr=") == ("sr", ())
    for bad in ("x", "x=1,a", "=1,2", "x=0,3", "x=1,,2", "x=1x3"):
        with pytest.raises(ModelImportError, match="NAME=D1,D2,..."):
            parse_shape(bad)


def test_one_default_opset_for_every_frontend_stage():
    # a model importing only another domain (onnx.checker rejects it; ONNX Runtime runs
    # it at the newest opset): folding, the unrollers, the Slice rewrite and the converter
    # all read it from frontend.fold.default_opset, which gives what ONNX Runtime uses
    from tvm_fusion.frontend.fold import default_opset

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    graph = helper.make_graph([helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
                               helper.make_node("Relu", ["u"], ["y"])], "g", [x], [y], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1)])
    assert default_opset(model) == onnx.defs.onnx_opset_version()
    model.opset_import.append(helper.make_opsetid("", 13))
    assert default_opset(model) == 13
    del model.opset_import[1:]

    imported = import_model(model, name="no-default-domain")  # opset 1 failed to convert
    arrays = random_inputs(imported.inputs, seed=3)
    (got,) = _run_tvm(imported, arrays)
    (want,) = run_onnxruntime(model, arrays)
    assert got.shape == (1, 2, 3) and max_rel_error(got, want) <= TOL


def test_reference_helpers():
    infos = [TensorInfo("x", (2, 3), "float32"), TensorInfo("ids", (4,), "int64"),
             TensorInfo("attention_mask", (4,), "int64"), TensorInfo("flag", (3,), "bool")]
    x, ids, mask, flag = random_inputs(infos, seed=7)
    assert x.dtype == np.float32 and x.shape == (2, 3)
    assert ids.dtype == np.int64 and ((0 <= ids) & (ids < 100)).all()
    assert (mask == 1).all() and flag.dtype == np.bool_
    assert all((a == b).all() for a, b in zip(random_inputs(infos, 7), (x, ids, mask, flag)))
    want = np.array([1e-12, 2.0, -4.0], np.float32)
    assert max_rel_error(want + np.float32(0.004), want) == pytest.approx(1e-3)
    assert max_rel_error(want, want.astype(np.float64)) == float("inf")
    assert max_rel_error(want[:2], want) == float("inf")


# ------------------------------------------------------------------- real models
def _ty_info(ty) -> tuple[tuple[int, ...], str]:
    return tuple(int(d) for d in ty.shape.values), str(ty.dtype)


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_real_model_imports(zoo_model, name):
    spec = zoo.ZOO[name]
    path = zoo_model(name)
    imported = import_model(path, spec.shapes, name=name)
    original = onnx.load(path)
    inits = {t.name for t in original.graph.initializer}
    in_names = [i.name for i in original.graph.input if i.name not in inits]
    assert [i.name for i in imported.inputs] == in_names
    assert {i.name: i.shape for i in imported.inputs if i.name in spec.shapes} == spec.shapes
    assert [o.name for o in imported.outputs] == [o.name for o in original.graph.output]

    main = imported.mod["main"]
    assert [_ty_info(p.ty) for p in main.params] == [(i.shape, i.dtype) for i in imported.inputs]
    ret = list(main.ret_ty.fields) if len(imported.outputs) > 1 else [main.ret_ty]
    assert [_ty_info(t) for t in ret] == [(o.shape, o.dtype) for o in imported.outputs]
    assert all(d > 0 for o in imported.outputs for d in o.shape)

    # Folding only evaluated what ONNX Runtime would compute: same outputs (no TVM build).
    arrays = random_inputs(imported.inputs, seed=0)
    for a, b in zip(run_onnxruntime(imported.onnx_model, arrays),
                    run_onnxruntime(original, arrays)):
        assert max_rel_error(a, b) <= TOL


@pytest.mark.parametrize("name", ["ppocr-cls", "ppocr-rec"])
def test_stock_importer_rejects_ppocr(zoo_model, name):
    path = zoo_model(name)
    shapes = {k: list(v) for k, v in zoo.ZOO[name].shapes.items()}
    with pytest.raises(TypeError, match="Reshape requires the input new shape to be Shape"):
        _stock_import(onnx.load(path), shapes)
    folded = import_model(path, zoo.ZOO[name].shapes).onnx_model
    inits = {t.name for t in folded.graph.initializer}
    assert "Shape" not in {n.op_type for n in folded.graph.node}
    assert all(n.input[1] in inits for n in folded.graph.node if n.op_type == "Reshape")


def test_zoo_unknown_name():
    with pytest.raises(TvmFusionError, match="known: .*ppocr-rec"):
        zoo.fetch("resnet-9000")
