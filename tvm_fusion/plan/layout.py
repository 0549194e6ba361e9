"""The activation layout of a model's convolutions, chosen per target by predicted time.

On a CPU target the planner builds the graph twice, in NCHW and in NCHW{c}c with ``c``
the fp32 lanes of the target's vectors (``vector_width_bits / 32``: 16 on AVX-512, 8 on
AVX2; :func:`~tvm_fusion.graph.layout.convert_layout`), plans both and keeps the one
whose plan is predicted faster. The NCHW{c}c plan pays for the ``layout_transform``
kernels it inserts (their DRAM bytes, or fused into a neighbour) and gains the
convolutions' lane utilisation (:func:`~tvm_fusion.plan.cost.lane_utilisation`). GPU
targets keep NCHW. The decision is per model, not per conv chain: one layout for every
conv whose channels divide by ``c``.

The layout is recorded in the plan (``FusionPlan.layout``), so ``compile``, ``jit`` and
``tune`` rebuild the graph the plan was made for
(:func:`~tvm_fusion.plan.combine.graph_for_plan`); a plan
without the field is NCHW.
"""

from __future__ import annotations

import dataclasses

import tvm

from ..errors import PlanError
from ..family import strategy
from ..graph import OpGraph, build_graph
from ..graph.layout import NCHW, block_of, convert_layout, count_blocked_convs
from .cost import AnalyticalCostModel
from .cost_planner import TIE_FLOOR_US, TIE_FRACTION
from .fusion_plan import FusionPlan
from .options import LAYOUTS



def blocked_layout(hw) -> str:
    """``NCHW{c}c`` with ``c`` the fp32 lanes of ``hw``'s vectors."""
    return f"NCHW{max(int(hw.vector_width_bits) // 32, 2)}c"


def resolve_layout(layout: str, hw) -> str:
    """``auto``, or the explicit layout ``layout`` names on ``hw``.

    Raises
    ------
    PlanError
        An unknown value, or a blocked layout asked of a GPU target.
    """
    low = str(layout).lower()
    if low == "auto":
        return "auto"
    name = NCHW if low == "nchw" else blocked_layout(hw) if low == "nchwc" else str(layout)
    try:
        c = block_of(name)
    except PlanError:
        raise PlanError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)} "
                        "or NCHW{c}c (e.g. NCHW16c)") from None
    if c and not strategy(hw).blocked_layouts:
        raise PlanError(f"layout {name} is for CPU targets; {hw.name!r} is a "
                        f"{hw.family} GPU and keeps NCHW: pass --layout nchw or auto")
    return name


def graph_in_layout(mod: tvm.IRModule, layout: str) -> OpGraph:
    """``mod``'s graph with its convolutions in ``layout`` (``NCHW`` or ``NCHW{c}c``)."""
    return build_graph(convert_layout(mod, layout))


def _transform_terms(graph: OpGraph, hw) -> tuple[int, int, float]:
    """Count, DRAM bytes and predicted time (each its own kernel) of the activation
    layout transforms in ``graph``."""
    cost = AnalyticalCostModel(graph, hw)
    ids = [n.id for n in graph.nodes if "layout_transform" in n.op]
    nbytes = sum(graph.nodes[i].bytes_read + graph.nodes[i].bytes_written for i in ids)
    return len(ids), nbytes, sum(cost.group_cost([i]).total_us for i in ids)


def _conv_compute_us(graph: OpGraph, hw) -> float:
    cost = AnalyticalCostModel(graph, hw)
    return sum(cost.group_cost([n.id]).compute_us for n in graph.nodes
               if n.op.startswith("conv2d"))


def choose_layout(mod: tvm.IRModule, hw, make_plan, *, layout: str = "auto",
                  say=None) -> tuple[OpGraph, FusionPlan]:
    """Choose the layout of ``mod``'s convolutions on ``hw``, build its graph and plan it.

    Parameters
    ----------
    mod : tvm.IRModule
        The imported (unlegalized) module.
    hw : HardwareTarget
    make_plan : callable
        ``make_plan(graph, hw) -> FusionPlan``, the planner.
    layout : str
        ``auto`` (by predicted time on CPU targets, NCHW on GPUs), ``nchw``, ``nchwc``
        (NCHW{c}c for the target's vector width) or an explicit ``NCHW{c}c``.
    say : callable, optional
        Told each stage as it begins (``say("planning 120 ops")``).

    Returns
    -------
    (OpGraph, FusionPlan)
        The plan carries ``layout`` and ``layout_reason``.
    """
    say = say or (lambda stage: None)
    want = resolve_layout(layout, hw)
    if want != "auto":
        say(f"layout {want}: building the graph")
        try:
            graph = graph_in_layout(mod, want)
        except (RuntimeError, ValueError) as err:  # TVM 0.27: RuntimeError subclasses; its Python legalizers: ValueError
            why = " ".join(str(err).strip().splitlines()[-1:])[:200]
            raise PlanError(f"layout {want} cannot be applied to this model: TVM's "
                            f"ConvertLayout failed ({why}); use --layout auto or nchw") from err
        say(f"layout {want}: planning {len(graph.nodes)} ops")
        plan = make_plan(graph, hw)
        return graph, dataclasses.replace(plan, layout=want, layout_reason=f"forced ({layout})")
    say("building the graph")
    base_graph = build_graph(mod)
    say(f"planning {len(base_graph.nodes)} ops")
    base = make_plan(base_graph, hw)
    if not strategy(hw).blocked_layouts:
        return base_graph, dataclasses.replace(
            base, layout_reason=f"{hw.family} target: activations keep the model's layout")
    name = blocked_layout(hw)
    if not count_blocked_convs(mod)[1]:  # no conv: skip the second graph
        return base_graph, dataclasses.replace(base, layout_reason="no conv2d: NCHW")
    try:
        say(f"layout {name}: converting and building the graph")
        blocked_mod = convert_layout(mod, name)
        k, total = count_blocked_convs(blocked_mod)
        if k:
            graph = build_graph(blocked_mod)
            say(f"layout {name}: planning {len(graph.nodes)} ops")
            plan = make_plan(graph, hw)
    except (RuntimeError, ValueError) as err:  # TVM 0.27: RuntimeError subclasses; its Python legalizers: ValueError
        # Relax's ConvertLayout has no rule for some ops next to a conv (magika's
        # 3-D tensors: "Invalid SLayout: can't find S in source layout ABC"), or converts
        # YOLOv8's channel Split into slices of 0 channels (nudenet-320n: the next conv's
        # legalization raises ValueError): the model still plans and runs in its own layout
        why = " ".join(str(err).strip().splitlines()[-1:])[:200]
        return base_graph, dataclasses.replace(base, layout_reason=(
            f"{name} conversion failed in TVM's ConvertLayout ({why}): NCHW"))
    if not k:
        return base_graph, dataclasses.replace(base, layout_reason=(
            f"no conv2d with channels divisible by {block_of(name)}: NCHW"))
    count, nbytes, t_us = _transform_terms(graph, hw)
    nchw_convs_us = _conv_compute_us(base_graph, hw)
    gain = nchw_convs_us - _conv_compute_us(graph, hw)
    # a transform fused into a neighbour is an index remap there, priced at nothing more
    alone = sum(len(g.nodes) == 1 and "layout_transform" in graph.nodes[g.nodes[0]].op
                for g in plan.groups)
    terms = (f"{k} of {total} convs blocked; conv compute {gain:+.2f} us saved by lane "
             f"utilisation and the NCHW conv share; {count} layout transforms moving "
             f"{nbytes / 1024:.1f} KB, {count - alone} of them fused into neighbouring "
             f"kernels ({t_us:.1f} us if each were a kernel of its own)")
    # within the model's error on the convs and transforms it moves: the simpler layout
    margin = TIE_FRACTION * (nchw_convs_us + t_us) + TIE_FLOOR_US
    tie = abs(base.est_us - plan.est_us) <= margin
    if tie:
        terms += (f"; a difference within the model's error ({margin:.1f} us) is a tie, "
                  "which keeps NCHW")
    if plan.est_us < base.est_us and not tie:
        return graph, dataclasses.replace(plan, layout=name, layout_reason=(
            f"predicted {plan.est_us:.1f} us against {base.est_us:.1f} us in NCHW "
            f"({terms})"))
    return base_graph, dataclasses.replace(base, layout_reason=(
        f"predicted {base.est_us:.1f} us against {plan.est_us:.1f} us in {name} ({terms})"))

