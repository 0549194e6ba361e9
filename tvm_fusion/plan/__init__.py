"""Plan stage: decide which operators share a kernel, and apply that decision."""

from .apply import apply_plan, check_plan
from .baseline import plan_from_groups, plan_fuseops
from .fusion_plan import FusedGroup, FusionPlan

__all__ = ["FusedGroup", "FusionPlan", "apply_plan", "check_plan", "plan_from_groups",
           "plan_fuseops"]
