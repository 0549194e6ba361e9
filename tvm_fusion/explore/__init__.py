"""Exploration helpers for notebooks: plan views, comparisons and plots.

Everything here is also what ``_repr_html_`` of the main objects renders.
"""

from .plan_view import PlanComparison, TargetComparison, compare_targets, draw_plan, plan_html

__all__ = ["PlanComparison", "TargetComparison", "compare_targets", "draw_plan", "plan_html"]
