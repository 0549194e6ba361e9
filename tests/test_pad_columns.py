"""A matmul by a wide constant with a ragged column count (PP-OCR rec's 6625-class CTC head)
is computed over zero-padded 16-column panels (tvm_fusion.graph.pad_columns): the model
still matches ONNX Runtime, and the kernel gets the register-tile space it had none of."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from tvm_fusion import compile_model, import_model
from tvm_fusion.graph import build_graph, legalize
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime
from tvm_fusion.targets import load_target
from tvm_fusion.compat.fast_import import build_kernel
from tvm_fusion.tune.space import load_search_space, space_generator


def _head(n: int, k: int = 48, rows: int = 8):
    """x[1, rows, k] @ W[k, n] + b, as a classifier head exports."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])],
        [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")])
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _matmul(mod) -> tvm.tirx.PrimFunc:
    return next(f for gv, f in mod.functions.items()
                if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith("matmul"))


def test_ragged_wide_constant_is_padded_and_the_model_matches_onnxruntime():
    model = _head(600)
    func = _matmul(build_graph(model.mod).mod)
    shapes = [[int(d) for d in p.ty.shape] for p in func.params]
    assert shapes == [[1, 8, 48], [48, 608], [1, 8, 600]]  # 600 -> 38 panels of 16
    x = random_inputs(model.inputs, seed=1)
    vm = relax.VirtualMachine(compile_model(model, "host").executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x[0])).numpy()
    assert got.shape == (1, 8, 600)
    assert max_rel_error(got, run_onnxruntime(model.onnx_model, x)[0]) <= 1e-5


@pytest.mark.parametrize("n", [100, 640])
def test_narrow_or_aligned_constants_keep_tvm_legalization(n):
    """Under MIN_COLUMNS, or already a multiple of 16: TVM's kernel and workload hash."""
    model = _head(n)
    stock = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(),
                                      relax.transform.LegalizeOps(),
                                      relax.transform.AnnotateTIROpPattern()])(model.mod)
    tvm.ir.assert_structural_equal(_matmul(legalize(model.mod)), _matmul(stock))


def test_padded_matmul_has_a_register_tile_space_with_the_copy_out_at_the_tile():
    host = load_target("host").tvm_target()
    func = _matmul(build_graph(_head(600).mod).mod).with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    ctx = ms.TuneContext(mod=mod, target=host, search_strategy="evolutionary", rand_state=1,
                         space_generator=space_generator(load_search_space("cpu"), host))
    spaces = ctx.generate_design_space()
    tiles = [s for s in spaces
             if any(i.kind.name == "Annotate" and "tvm_fusion.register_tile" in str(i.inputs[1])
                    for i in s.trace.insts)]
    assert tiles, "no register-tile space for the padded matmul"
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (1, 8, 48)).astype(np.float32)
    w = rng.uniform(-1, 1, (48, 608)).astype(np.float32)
    w[:, 600:] = 0  # what the legalization pads with
    want = (a @ w)[..., :600]
    for sch in tiles:
        sch = sch.copy()
        assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
        update = sch.get_sblock("matmul_update")
        copy = sch.get_loops(sch.get_sblock("T_strided_slice"))
        # the copy-out runs inside the tile's parallel loop, not as a second pass
        assert sch.get(copy[0]).same_as(sch.get(sch.get_loops(update)[0]))
        out = tvm.runtime.tensor(np.zeros((1, 8, 600), np.float32))
        build_kernel(sch.mod, host, None)(tvm.runtime.tensor(a), tvm.runtime.tensor(w), out)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
