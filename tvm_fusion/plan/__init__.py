"""Plan stage: decide which operators share a kernel, and apply that decision."""

from .apply import apply_plan, check_plan
from .baseline import plan_from_groups, plan_fuseops
from .cost import AnalyticalCostModel, GroupCost
from .cost_planner import describe_plan, plan_cost
from .fusion_plan import FusedGroup, FusionPlan, RejectedMerge

PLANNERS = ("fuseops", "cost")


def make_plan(graph, hw, planner: str = "cost") -> FusionPlan:
    """Plan ``graph`` on hardware ``hw`` with the named planner (see :data:`PLANNERS`)."""
    import dataclasses

    from ..errors import PlanError

    if planner == "fuseops":
        plan = describe_plan(graph, hw, plan_fuseops(graph, hw))
    elif planner == "cost":
        plan = plan_cost(graph, hw)
    else:
        raise PlanError(f"unknown planner {planner!r}; expected one of {', '.join(PLANNERS)}")
    edges = tuple((i, n.id) for n in graph.nodes for i in dict.fromkeys(n.inputs))
    return dataclasses.replace(plan, edges=edges)

__all__ = ["AnalyticalCostModel", "FusedGroup", "FusionPlan", "GroupCost", "PLANNERS",
           "RejectedMerge", "apply_plan", "check_plan", "describe_plan", "make_plan", "plan_cost",
           "plan_from_groups", "plan_fuseops"]
