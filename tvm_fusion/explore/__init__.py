"""Exploration helpers for notebooks: plan views, comparisons and plots.

Importing this module registers its HTML views with IPython (when it runs) for the core
objects, which know nothing of views: a ``FusionPlan``, a ``PlanComparison`` and a cost
model's ``RankModel`` then show themselves as tables and drawings in Jupyter.
"""

from ..plan import FusionPlan, PlanComparison
from .cost_view import cost_model_html, plot_predicted_vs_measured
from .log_view import LogView, open_logs
from .plan_view import TargetComparison, compare_targets, comparison_html, draw_plan, plan_html
from .tuning import (KernelResult, TuningCurve, kernel_results, metaschedule_curve,
                     plot_roofline, plot_tuning_curves, tune_metaschedule, tuning_curve)


def _register_html_views() -> None:
    """Make IPython render the core objects with these views (a no-op outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    html = shell.display_formatter.formatters["text/html"]
    html.for_type(FusionPlan, plan_html)
    html.for_type(PlanComparison, comparison_html)
    # by name: registering must not import xgboost, which the cost model needs
    html.for_type_by_name("tvm_fusion.costmodel.model", "RankModel", cost_model_html)


_register_html_views()

__all__ = ["KernelResult", "LogView", "TargetComparison", "TuningCurve", "compare_targets",
           "comparison_html", "cost_model_html", "draw_plan", "kernel_results",
           "metaschedule_curve", "open_logs", "plan_html", "plot_predicted_vs_measured",
           "plot_roofline", "plot_tuning_curves", "tune_metaschedule", "tuning_curve"]
