"""Exploration helpers for notebooks: plan views, comparisons and plots.

Everything here is also what ``_repr_html_`` of the main objects renders.
"""

from .cost_view import cost_model_html, plot_predicted_vs_measured, rank_correlation
from .log_view import LogView, open_logs
from .plan_view import PlanComparison, TargetComparison, compare_targets, draw_plan, plan_html
from .tuning import (KernelResult, TuningCurve, kernel_results, metaschedule_curve,
                     plot_roofline, plot_tuning_curves, tune_metaschedule, tuning_curve)

__all__ = ["KernelResult", "LogView", "PlanComparison", "TargetComparison",
           "TuningCurve", "compare_targets", "cost_model_html", "draw_plan",
           "kernel_results", "metaschedule_curve", "open_logs", "plan_html",
           "plot_predicted_vs_measured", "plot_roofline", "plot_tuning_curves",
           "rank_correlation", "tune_metaschedule", "tuning_curve"]
