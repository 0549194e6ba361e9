"""Plan stage: decide which operators share a kernel, and apply that decision."""

from .apply import apply_plan, check_plan
from .baseline import plan_from_groups, plan_fuseops
from .cost import AnalyticalCostModel, GroupCost
from .cost_planner import describe_plan, plan_cost
from .fusion_plan import FusedGroup, FusionPlan, RejectedMerge

PLANNERS = ("fuseops", "cost")

__all__ = ["AnalyticalCostModel", "FusedGroup", "FusionPlan", "GroupCost", "PLANNERS",
           "RejectedMerge", "apply_plan", "check_plan", "describe_plan", "plan_cost",
           "plan_from_groups", "plan_fuseops"]
