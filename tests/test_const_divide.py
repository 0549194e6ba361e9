"""float32 division by a constant runs as a multiplication by the reciprocal
(tvm_fusion.graph.const_divide): per channel and by a scalar, the PrimFunc still named
``divide``, and outputs within an ulp of ONNX Runtime's quotient; a division by a
tensor that is not constant stays one."""

from __future__ import annotations

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion import compile_model, import_model
from tvm_fusion.graph import build_graph
from tvm_fusion.reference import random_inputs, run_onnxruntime


def _divides(d1: np.ndarray):
    """b = x / d1 (per channel) / 6 (scalar); z = b / x (no constant: a division)."""
    nodes = [helper.make_node("Div", ["x", "d1"], ["a"]),
             helper.make_node("Div", ["a", "six"], ["b"]),
             helper.make_node("Div", ["b", "x"], ["z"])]
    inits = [numpy_helper.from_array(d1, "d1"),
             numpy_helper.from_array(np.array(6, np.float32), "six")]
    graph = helper.make_graph(nodes, "divides",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_division_by_a_constant_multiplies_and_matches_onnxruntime():
    d1 = np.array([0.3, 1.7, 3.0, 1e-3], np.float32).reshape(1, 4, 1, 1)
    proto = _divides(d1)
    model = import_model(proto, simplify=False)  # keep each Div an op of its own
    graph = build_graph(model.mod)
    funcs = {gv.name_hint: f.script() for gv, f in graph.mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith("divide")}
    assert len(funcs) == 3, sorted(funcs)  # the name the BN/HardSwish patterns read
    divides = [name for name, text in funcs.items() if " / " in text]
    assert len(divides) == 1  # only the division by x still divides
    inputs = random_inputs(model.inputs, seed=1)
    module = compile_model(model, "host")
    vm = tvm.relax.VirtualMachine(module.executable, tvm.cpu())
    got = [o.numpy() for o in vm["main"](tvm.runtime.tensor(inputs[0]))]
    want = run_onnxruntime(proto, inputs)
    np.testing.assert_array_max_ulp(got[0], want[0], maxulp=2)
    np.testing.assert_array_max_ulp(got[1], want[1], maxulp=4)
