"""Model + tuning logs -> the kernels to build: the one step tune, compile, the offline
bundle, the explore views and the cost-model data all start from.

The step: read the target directory's manifest, find the model's entry, take the plan
given, else the stored one (its layout and combined matmuls included), else plan afresh;
rebuild the operator graph the plan was made for; settle weight prepacking against the
records; and outline the plan into its fused kernel module (MetaSchedule's tasks).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from ..errors import LogError, OptionError
from ..gpu.resources import plan_resources
from ..graph import OpGraph
from ..plan import FusionPlan, PlanOptions, graph_for_plan, plan_model
from ..targets import HardwareTarget, as_target
from ..logs.dirs import target_dir
from ..logs.manifest import Manifest, ModelEntry, load_manifest, read_manifest
from .prepack import resolve_prepack
from .schedulable import kernel_module, make_schedulable

BEFORE_SIMPLIFY = ("off", "warn", "quiet")
PREPACK_OF = ("entry", "plan")


@dataclass(frozen=True, kw_only=True)
class KernelOptions:
    """How :func:`prepare_kernels` finds or makes the plan, and what it checks.

    Attributes
    ----------
    plan : FusionPlan, optional
        Use this plan rather than the stored one or a fresh one.
    plan_options : PlanOptions
        How a fresh plan (no ``plan``, none stored) partitions and lays out the model
        (planner, layout, combine, resources, group_model), and the weight prepacking
        asked for (``prepack``; None: the records' setting, else the target's default:
        :func:`tvm_fusion.kernels.prepack.resolve_prepack`). A stored or given plan keeps
        its own partition and layout.
    prepack_of : str
        Which entry's setting ``prepack`` must agree with: ``entry``, the model's (a
        build applies its records whatever the plan); ``plan``, only an entry of the
        same plan (tuning a new plan starts a new entry).
    allow_other_target : bool
        Use logs whose manifest names another target key or hardware hash.
    check_logs : bool
        Refuse a manifest of another schema, TVM version or (see
        ``allow_other_target``) target. False reads any manifest as it is (the explore
        views, which only read timings).
    require_entry : bool
        Raise :class:`~tvm_fusion.errors.LogError` unless the logs hold the model.
    before_simplify : str
        Logs tuned before graph simplification (the model's entry is absent, its
        ``unsimplified`` model's present, no ``plan`` given): ``off``, use the model as
        given; ``warn``, use the unsimplified model and say so; ``quiet``, use it
        silently.
    schedulable : bool
        Split the groups MetaSchedule cannot schedule and extract the tasks now
        (:func:`~tvm_fusion.kernels.schedulable.make_schedulable`): what a search needs.
    """

    plan: FusionPlan | None = None
    plan_options: PlanOptions = PlanOptions()
    prepack_of: str = "entry"
    allow_other_target: bool = False
    check_logs: bool = True
    require_entry: bool = False
    before_simplify: str = "off"
    schedulable: bool = False

    def __post_init__(self):
        if not isinstance(self.plan_options, PlanOptions):
            raise OptionError(f"KernelOptions.plan_options must be a PlanOptions; got "
                              f"{type(self.plan_options).__name__}", field="plan_options",
                              allowed="PlanOptions")
        for name, allowed in (("before_simplify", BEFORE_SIMPLIFY),
                              ("prepack_of", PREPACK_OF)):
            value = getattr(self, name)
            if value not in allowed:
                choices = ", ".join(map(repr, allowed))
                raise OptionError(f"KernelOptions.{name} must be one of {choices}; got "
                                  f"{value!r}", field=name, allowed=choices)


@dataclass(frozen=True, kw_only=True)
class KernelSet:
    """The kernels of one model for one target, and where they came from.

    Attributes
    ----------
    model : ImportedModel
        The model the kernels are of: the one given, or its unsimplified form when the
        logs were tuned before simplification (see ``KernelOptions.before_simplify``).
    hw : HardwareTarget
    tdir : Path or None
        The target directory of the logs; None without logs.
    manifest : Manifest or None
        Its manifest as read; None without logs or without a manifest.
    entry : ModelEntry or None
        The model's entry in it.
    graph : OpGraph
        The operator graph ``plan`` was made for.
    plan : FusionPlan
        The plan (after splitting, with ``schedulable``).
    stored_plan : bool
        Whether ``plan`` is the one stored in the logs.
    prepack : bool
        Whether the kernels' constant weights are layout-free (prepacked at build).
    mod : tvm.IRModule
        The fused kernel module (built on first use).
    tasks : list of ExtractedTask
        MetaSchedule's tasks of ``mod`` (extracted on first use).
    """

    model: Any
    hw: HardwareTarget
    tdir: Path | None
    manifest: Manifest | None
    entry: ModelEntry | None
    graph: OpGraph
    plan: FusionPlan
    stored_plan: bool
    prepack: bool
    _fused: tuple | None = field(default=None, repr=False, compare=False)

    @cached_property
    def mod(self) -> tvm.IRModule:
        # lazy: a build refuses some graphs before it outlines anything, and the
        # cost-model data needs only the graph
        if self._fused is not None:
            return self._fused[0]
        return kernel_module(self.graph, self.plan, prepack=self.prepack)

    @cached_property
    def tasks(self) -> list:
        if self._fused is not None:
            return self._fused[1]
        return ms.relax_integration.extract_tasks(self.mod, self.hw.tvm_target())


def _manifest(tdir: Path | None, hw, options: KernelOptions) -> Manifest | None:
    if tdir is None:
        return None
    if not options.check_logs:
        return load_manifest(tdir)
    return read_manifest(tdir, expect=hw, allow_other_target=options.allow_other_target,
                         fresh=False)


def _tuned_before_simplify(model, manifest: Manifest | None, logs, how: str):
    """(model, entry) of logs tuned on the graph as converted: their plan names the
    unsimplified graph's ops and their records its kernels, so a simplified model falls
    back to the model it was simplified from."""
    old = getattr(model, "unsimplified", None)
    entry = manifest.entry(old.model_hash) if old is not None and manifest else None
    if entry is None:
        return model, None
    if how == "warn":
        warnings.warn(
            f"the logs in {logs} were tuned for {model.source} without graph simplification "
            f"(another graph, other kernels: {model.simplified.summary()}); deploying the "
            "unsimplified graph they were tuned for. Re-tune into these logs to deploy the "
            "simplified graph, or import with simplify=False (CLI: --no-simplify) to silence "
            "this", stacklevel=4)
    return old, entry


def prepare_kernels(model, target: str | HardwareTarget = "host", logs=None,
                    options: KernelOptions = KernelOptions()) -> KernelSet:
    """The kernels to build for ``model`` on ``target``, from the plan in ``logs``.

    Parameters
    ----------
    model : ImportedModel
    target : str or HardwareTarget
    logs : path, optional
        A log directory (``logs/<target>/manifest.json`` is read); None: no records,
        the plan is ``options.plan`` or a fresh one.
    options : KernelOptions

    Returns
    -------
    KernelSet

    Raises
    ------
    LogError
        The manifest is refused (``options.check_logs``), the model is not in it
        (``options.require_entry``), or ``options.plan_options.prepack`` disagrees with
        the records.
    """
    hw = as_target(target)
    tdir = target_dir(logs, hw.name) if logs is not None else None
    manifest = _manifest(tdir, hw, options)
    if options.require_entry and manifest is None:
        raise LogError(f"{tdir} has no readable manifest.json: is {logs} a log directory "
                       f"tuned for target {hw.name}?")
    entry = manifest.entry(model.model_hash) if manifest is not None else None
    if entry is None and options.plan is None and options.before_simplify != "off":
        model, entry = _tuned_before_simplify(model, manifest, logs, options.before_simplify)
    if entry is None and options.require_entry:
        raise LogError(f"{tdir} holds no records for model {model.source!r} (hash "
                       f"{model.model_hash}); tune it first: tvm-fusion tune")
    plan = options.plan
    stored = plan is None and entry is not None
    if stored:
        plan = entry.fusion_plan()
    if plan is None:
        po = options.plan_options
        graph, plan = plan_model(model.mod, hw, po)
        plan, _ = plan_resources(graph, hw, plan, mode=po.resources, planner=po.planner,
                                 group_model=po.group_model)
    else:  # the layout and combined matmuls the plan was made with
        graph = graph_for_plan(model.mod, plan)
    records = entry
    if options.prepack_of == "plan" and entry is not None and entry.plan_hash != plan.hash:
        records = None  # another plan's records: this plan starts afresh
    prepack = resolve_prepack(options.plan_options.prepack, records, hw, where=tdir)
    fused = None
    if options.schedulable:
        plan, mod, tasks = make_schedulable(graph, plan, hw, hw.tvm_target(), prepack=prepack)
        fused = (mod, tasks)
    return KernelSet(model=model, hw=hw, tdir=tdir, manifest=manifest, entry=entry,
                     graph=graph, plan=plan, stored_plan=stored, prepack=prepack,
                     _fused=fused)
