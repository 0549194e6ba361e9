"""Plan stage: decide which operators share a kernel, and apply that decision."""

from __future__ import annotations

import dataclasses

from ..errors import OptionError, PlanError
from ..graph import OpGraph
from ..targets import HardwareTarget, as_target
from .apply import apply_plan, check_plan
from .baseline import plan_from_groups, plan_fuseops
from .compare import PlanComparison
from .cost import AnalyticalCostModel, GroupCost
from .cost_planner import describe_plan, plan_cost
from .combine import COMBINE_MODES, choose_combine, graph_for_plan, module_for_plan
from .fusion_plan import CombinedMatmuls, FusedGroup, FusionPlan, RejectedMerge
from .layout import LAYOUTS, choose_layout, graph_in_layout
from .options import PLANNERS, RESOURCE_MODES, PlanOptions


def make_plan(graph, hw, planner: str = "cost", *, group_model=None,
              compiled=None) -> FusionPlan:
    """Plan ``graph`` on hardware ``hw`` with the named planner (see :data:`PLANNERS`).

    ``group_model``: a learned group-latency model (anything with ``cost_model(graph, hw)``
    returning the planner's cost seam, e.g. :class:`tvm_fusion.costmodel.group_model.
    GroupModel`) that prices the groups; None: the analytical model. ``compiled``: GPU
    groups' kernel resources as a compiler allocated them (frozenset of node ids ->
    :class:`~.gpu_resources.GpuResources`, from :func:`tvm_fusion.gpu.resources.
    compiled_resources`), which replace the analytical model's estimates.
    """
    if group_model is not None:
        cost_model = group_model.cost_model(graph, hw)
    elif compiled:
        cost_model = AnalyticalCostModel(graph, hw, compiled=compiled)
    else:
        cost_model = None
    if planner == "fuseops":
        plan = describe_plan(graph, hw, plan_fuseops(graph, hw), cost_model=cost_model)
    elif planner == "cost":
        plan = plan_cost(graph, hw, cost_model=cost_model)
    else:
        raise PlanError(f"unknown planner {planner!r}; expected one of {', '.join(PLANNERS)}")
    edges = tuple((i, n.id) for n in graph.nodes for i in dict.fromkeys(n.inputs))
    return dataclasses.replace(plan, edges=edges)


def plan_model(mod, hw, options: PlanOptions = PlanOptions(), *, progress=None):
    """Plan module ``mod`` on ``hw`` as ``options`` say: choose the convolutions' layout
    (``options.layout``; :mod:`~tvm_fusion.plan.layout`), build its graph and plan it with
    ``options.planner`` (priced by ``options.group_model``, as :func:`make_plan`); then
    combine the parallel matmuls (Q/K/V) whose combined plan is predicted faster
    (``options.combine``; :mod:`~tvm_fusion.plan.combine`). ``options.resources`` and
    ``options.prepack`` are for the stages after planning (GPU kernel resources, the
    build) and are not read here. ``progress``: called with each stage as it begins
    (``progress("planning 120 ops")``), e.g. to show it.

    Returns
    -------
    (OpGraph, FusionPlan)
        The graph the plan was made for (:func:`graph_for_plan` rebuilds it from ``mod``
        and the plan).
    """
    if not isinstance(options, PlanOptions):
        raise OptionError(f"plan_model's options must be a PlanOptions (e.g. PlanOptions("
                          f"planner='fuseops')); got {options!r}", field="options",
                          allowed="PlanOptions")
    hw = as_target(hw)
    planner, group_model = options.planner, options.group_model
    make = lambda g, h: make_plan(g, h, planner, group_model=group_model)  # noqa: E731
    graph, plan = choose_layout(mod, hw, make, layout=options.layout, say=progress)
    if planner != "cost" and options.combine == "auto":  # the baseline is stock TVM's graph
        return graph, plan
    return choose_combine(mod, hw, make, graph, plan, combine=options.combine, say=progress)


def plan_fusion(graph: OpGraph, target: str | HardwareTarget = "host", *,
                planner: str = "cost", group_model=None) -> FusionPlan:
    """Partition ``graph``'s operators into kernels for ``target``.

    Parameters
    ----------
    graph : OpGraph
        From :func:`~tvm_fusion.build_graph`.
    target : str or HardwareTarget
        A name from ``hw_targets/`` or ``"host"``.
    planner : str
        ``"cost"`` (default): the hardware-aware planner, by predicted time on
        ``target``. ``"fuseops"``: TVM's own FuseOps partition, the baseline.
    group_model : optional
        A learned group-latency model to price the kernels with (see :func:`make_plan`).

    Returns
    -------
    FusionPlan
        Groups of operators, each with its stable op names, predicted time and the
        reason for it (``plan.explain(op)`` answers why an op was or was not fused).
    """
    return make_plan(graph, as_target(target), planner, group_model=group_model)

__all__ = ["COMBINE_MODES", "AnalyticalCostModel", "CombinedMatmuls", "FusedGroup",
           "FusionPlan", "GroupCost", "LAYOUTS", "PLANNERS", "PlanComparison", "PlanOptions",
           "RESOURCE_MODES",
           "RejectedMerge", "apply_plan", "check_plan", "choose_combine", "describe_plan",
           "graph_for_plan", "graph_in_layout", "make_plan", "module_for_plan", "plan_cost",
           "plan_fusion", "plan_from_groups", "plan_fuseops", "plan_model"]
