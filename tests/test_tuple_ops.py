"""Tuple-valued and data-dependent ops through every stage (issue 17): Split (opset 13
and 18 forms), TopK, NonMaxSuppression and NonZero, each planned, compiled for the host,
exported, loaded and checked against ONNX Runtime."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import onnx_cases as oc
from tvm_fusion import (PlanOptions, build_graph, compile_model, import_model, load_module,
                        load_target)
from tvm_fusion.errors import LoweringError, PlanError
from tvm_fusion.plan import apply_plan, make_plan, plan_from_groups
from tvm_fusion.plan.baseline import tvm_fuseops_groups
from tvm_fusion.reference import max_rel_error, random_inputs, run_onnxruntime


def _check_against_ort(proto, tmp_path, *, inputs=None, plan=None, planner="cost"):
    """Compile for the host, export, load, run; every output equals ONNX Runtime's."""
    model = import_model(proto)
    compiled = compile_model(model, "host", plan=plan, plan_options=PlanOptions(planner=planner))
    module = load_module(compiled.export(tmp_path / f"{proto.graph.name}.so"))
    inputs = inputs or random_inputs(model.inputs, seed=3)
    got, want = module(*inputs), run_onnxruntime(proto, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert max_rel_error(g, w) < 1e-5
    return model, compiled


def _groups_by_op(graph, plan):
    return [sorted(graph.nodes[n].op for n in g.nodes) for g in plan.groups]


@pytest.mark.parametrize("case", [oc.split13, oc.split18, oc.split_gemm])
@pytest.mark.parametrize("planner", ["cost", "fuseops"])
def test_split_plans_compiles_and_matches_onnxruntime(case, planner, tmp_path):
    _check_against_ort(case(), tmp_path, planner=planner)


def test_split_is_one_node_with_a_tensor_per_piece():
    graph = build_graph(import_model(oc.split13()).mod)
    split = next(n for n in graph.nodes if n.op == "split")
    assert [(r.shape, r.dtype, r.nbytes) for r in split.results] == [
        ((1, 2, 4, 4), "float32", 128), ((1, 6, 4, 4), "float32", 384)]
    readers = {graph.nodes[u].op: item for item, us in graph.result_readers().items()
               for u in us if item[0] == split.id}
    assert readers == {"multiply": (split.id, 0), "tir_sigmoid": (split.id, 1)}
    # TVM's FuseOps fuses the whole chain, Split and its TupleGetItems included
    assert tvm_fuseops_groups(graph) == [[0, 1, 2, 3, 4]]


def test_split_before_two_matmuls_stays_a_two_output_kernel():
    """A MatMul takes no fused prologue: on every target the Split joins the Relu before
    it and writes both pieces; each MatMul reads its piece."""
    graph = build_graph(import_model(oc.split_gemm()).mod)
    for target in ("host", "a100", "mi250x"):
        plan = make_plan(graph, load_target(target), "cost")
        groups = _groups_by_op(graph, plan)
        assert ["relu", "split"] in groups, (target, groups)
        assert sum("split" in g for g in groups) == 1
        assert not any("split" in g and "matmul" in g for g in groups)


@pytest.mark.parametrize("groups", [
    [[0, 1], [2], [3], [4]],          # a two-output kernel (Relu + Split)
    [[0], [1, 2], [1, 3], [4]],       # each reader takes the Split as its prologue
    [[0, 1, 2], [1, 3, 4]],           # the Split duplicated, one copy with the Relu
    [[0, 1, 3], [2], [4]],            # one piece read inside, the other exported
])
def test_apply_plan_accepts_any_convex_grouping_around_a_split(groups, tmp_path):
    graph = build_graph(import_model(oc.split13()).mod)
    plan = plan_from_groups(graph, groups, load_target("host"), planner="hand")
    _, compiled = _check_against_ort(oc.split13(), tmp_path, plan=plan)
    assert len(compiled.kernels) == len(groups)


def test_fused_split_computes_only_the_pieces_its_group_reads():
    graph = build_graph(import_model(oc.split13()).mod)
    plan = plan_from_groups(graph, [[0], [1, 2], [1, 3], [4]], load_target("host"),
                            planner="hand")
    func = apply_plan(graph, plan)["fused_split_multiply"]
    assert "T_split_1" not in func.script() and "T_split" in func.script()


def test_topk_is_its_own_kernel_named_data_dependent(tmp_path):
    model, compiled = _check_against_ort(oc.topk(), tmp_path)
    graph = build_graph(model.mod)
    plan = make_plan(graph, load_target("host"), "cost")
    (group,) = [g for g in plan.groups if "topk" in g.name]
    assert group.nodes == (1,)
    assert group.reason.startswith("not fusable: data-dependent output")
    assert "topk" in compiled.kernels  # lowered by TVM's DispatchSortScan (topi.topk)


def test_topk_builds_for_a100():
    if not shutil.which("nvcc"):  # nvcc compiles the CUDA kernels; no GPU is needed
        pytest.skip("nvcc not on PATH")
    compiled = compile_model(import_model(oc.topk()), "a100")
    assert "topk" in compiled.kernels


def test_non_max_suppression_matches_onnxruntime(tmp_path):
    model, _ = _check_against_ort(oc.nms(), tmp_path, inputs=oc.nms_inputs())
    plan = make_plan(build_graph(model.mod), load_target("host"), "cost")
    assert all(len(g.nodes) == 1 for g in plan.groups)
    assert all("data-dependent output" in g.reason for g in plan.groups)


def test_non_max_suppression_on_a_gpu_names_the_node_and_the_fix():
    """TVM 0.27 legalizes NMS to a CPU-style kernel that dlight cannot schedule and its
    TIR pipeline rejects: one error naming the ONNX node and what to do."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not on PATH")
    with pytest.raises(LoweringError, match=r"NonMaxSuppression node\(s\) 'nms0'.*CPU target"):
        compile_model(import_model(oc.nms()), "a100")


def test_nonzero_output_of_run_time_size(tmp_path):
    x = np.array([[0.5, -1, 2, 0], [-3, 0, 1, 1], [0, 0, -2, 4]], np.float32)
    model, _ = _check_against_ort(oc.nonzero(), tmp_path, inputs=[x])
    graph = build_graph(model.mod)
    node = next(n for n in graph.nodes if n.op == "nonzero")
    assert node.library and len(node.results[0].shape) == 2 and node.results[0].shape[1] == -1
    assert "known only at run time" in node.data_dependent


def test_a_hand_plan_grouping_a_data_dependent_op_is_refused():
    graph = build_graph(import_model(oc.topk()).mod)
    plan = plan_from_groups(graph, [[0, 1], [2]], load_target("host"), planner="hand")
    with pytest.raises(PlanError, match="topk#1.*data-dependent output"):
        apply_plan(graph, plan)


def test_unique_with_four_outputs_matches_onnxruntime(tmp_path):
    x = np.array([[1, 2], [0, 1], [1, 2], [3, 3], [0, 1], [5, 0]], np.float32)
    model, _ = _check_against_ort(oc.unique(), tmp_path, inputs=[x])
    (node,) = build_graph(model.mod).nodes
    assert node.library and len(node.results) == 4


def test_ops_after_a_run_time_sized_tensor_match_onnxruntime(tmp_path):
    """Compress (NonZero, then a take of run-time size) and the Mul after it: every node
    from the NonZero on is data-dependent, alone, and the result equals ONNX Runtime's."""
    x = np.array([0.5, -1, 2, 0, -3, 1, 1, 4], np.float32)
    model, _ = _check_against_ort(oc.compress(), tmp_path, inputs=[x])
    graph = build_graph(model.mod)
    plan = make_plan(graph, load_target("host"), "cost")
    dependent = {n.id for n in graph.nodes if n.data_dependent}
    assert {"nonzero", "multiply"} <= {graph.nodes[n].op for n in dependent}
    assert all(len(g.nodes) == 1 for g in plan.groups if set(g.nodes) & dependent)


def test_nonzero_read_by_a_kernel_runs_on_the_host_and_is_refused_for_a_gpu(tmp_path):
    """NonZero is a numpy function in TVM 0.27 (relax.run.nonzero) returning a host
    tensor: fine on a CPU, refused by name where GPU kernels would read it."""
    x = np.array([[0.5, -1, 2, 0], [-3, 0, 1, 1], [0, 0, -2, 4]], np.float32)
    model, _ = _check_against_ort(oc.nonzero_then_cast(), tmp_path, inputs=[x])
    with pytest.raises(LoweringError, match=r"NonZero node\(s\) 'nonzero0'.*CPU target"):
        compile_model(model, "a100")
