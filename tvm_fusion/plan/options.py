"""How a model is partitioned into kernels and laid out: :class:`PlanOptions`.

One frozen value carries the planning switches from the public API (``tune``,
``compile_model``, ``jit``), the command line and the kernels stage down to the planner,
so that no entry point repeats them as loose keywords.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError, PlanError
from ..graph.layout import block_of

PLANNERS = ("fuseops", "cost")
"""Values of ``planner``: TVM's own FuseOps partition, or the hardware-aware planner."""

LAYOUTS = ("auto", "nchw", "nchwc")
"""Values of the ``layout`` switch (an explicit ``NCHW{c}c`` is accepted too)."""

COMBINE_MODES = ("auto", "on", "off")
"""``auto``: by predicted time (cost planner; the FuseOps baseline combines nothing, as
stock TVM does not); ``on``: every group; ``off``: none."""

RESOURCE_MODES = ("auto", "compiled", "estimated")
"""Where a GPU plan's kernel resources come from (:func:`tvm_fusion.gpu.resources.
plan_resources`)."""


def _one_of(owner: str, name: str, value, allowed: tuple[str, ...], extra: str = "") -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed) + extra
        raise OptionError(f"{owner}.{name} must be one of {choices}; got {value!r}",
                          field=name, allowed=choices)


def _layout_ok(layout) -> bool:
    if not isinstance(layout, str):
        return False
    if layout.lower() in LAYOUTS:
        return True
    try:
        return block_of(layout) > 0
    except PlanError:
        return False


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """How a fresh plan partitions a model into kernels and lays out its data.

    A plan stored in the logs (or given as ``plan=``) keeps its own partition, layout and
    combined matmuls: these options decide only a plan made afresh, and ``prepack`` is
    checked against the records.

    Attributes
    ----------
    planner : str
        ``"cost"`` (default): the hardware-aware planner, by predicted time on the target.
        ``"fuseops"``: the partition TVM's own FuseOps makes, the baseline.
    layout : str
        Convolution activation layout: ``"auto"`` (default; on CPU targets NCHW or
        NCHW{c}c, whichever is predicted faster; GPUs keep NCHW), ``"nchw"``,
        ``"nchwc"``, or an explicit ``"NCHW{c}c"`` such as ``"NCHW16c"``
        (:mod:`~tvm_fusion.plan.layout`).
    combine : str
        Parallel matmuls reading one input (Q/K/V): ``"auto"`` (default; combined where
        the plan is predicted faster), ``"on"``, ``"off"`` (:mod:`~tvm_fusion.plan.combine`).
    resources : str
        GPU targets: ``"auto"`` (default) re-plans with the registers and shared memory
        the compiler allocates for each kernel where the compiler is here (nvcc; the
        gfx90a toolchain), ``"compiled"`` insists on it, ``"estimated"`` keeps the
        planner's estimates (:func:`tvm_fusion.gpu.resources.plan_resources`).
    group_model : optional
        A learned group-latency model pricing the kernels
        (:func:`~tvm_fusion.costmodel.group_model.load_group_model`); None (default): the
        analytical model.
    prepack : bool, optional
        Let CPU kernels read their constant weights in a layout of their own
        (MetaSchedule's ``RewriteLayout``), packed once at build. None (default): the
        setting the model's records were tuned with, else on for CPU targets and off for
        GPUs (:func:`tvm_fusion.kernels.prepack.resolve_prepack`). The other setting than
        the records' raises :class:`~tvm_fusion.errors.LogError`; ``False`` is for A/B
        measurement.

    Raises
    ------
    OptionError
        A field with a value it does not take; the message names the field and the
        values it takes.
    """

    planner: str = "cost"
    layout: str = "auto"
    combine: str = "auto"
    resources: str = "auto"
    group_model: Any = field(default=None, hash=False)
    prepack: bool | None = None

    def __post_init__(self):
        _one_of("PlanOptions", "planner", self.planner, PLANNERS)
        if not _layout_ok(self.layout):
            choices = ", ".join(repr(a) for a in LAYOUTS) + " or 'NCHW{c}c' (e.g. 'NCHW16c')"
            raise OptionError(f"PlanOptions.layout must be one of {choices}; got "
                              f"{self.layout!r}", field="layout", allowed=choices)
        _one_of("PlanOptions", "combine", self.combine, COMBINE_MODES)
        _one_of("PlanOptions", "resources", self.resources, RESOURCE_MODES)
        if self.prepack is not None and not isinstance(self.prepack, bool):
            raise OptionError(f"PlanOptions.prepack must be one of None, True, False; got "
                              f"{self.prepack!r}", field="prepack",
                              allowed="None, True, False")
        gm = self.group_model
        if gm is not None and not hasattr(gm, "cost_model"):
            got = repr(gm) if isinstance(gm, (str, os.PathLike)) else type(gm).__name__
            raise OptionError(
                f"PlanOptions.group_model must be None or a learned group model (with a "
                f"cost_model(graph, hw) method: load a file with tvm_fusion.costmodel."
                f"group_model.load_group_model(path)); got {got}",
                field="group_model", allowed="None or a learned group model")
