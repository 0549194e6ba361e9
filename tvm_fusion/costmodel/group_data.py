"""Measured kernels of the tuning logs, matched to the plan groups they were tuned for.

A tuning-log target directory (``manifest.json`` plus MetaSchedule's JSONL files) keeps,
per model, the plan it was tuned with and, per kernel of that plan, the workload key of
its task. :func:`kernel_records` re-imports each model with its recorded input shapes,
rebuilds the operator graph the stored plan was made for, and pairs every plan group
with the best verified measured time of its workload. ``benchmarks/planner_accuracy.py``
prints these; :mod:`.group_model` trains on them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import TvmFusionError
from ..family import strategy
from ..logs.tools import _load
from ..plan import AnalyticalCostModel
from ..plan.cost import CPU_CALL_US
from ..targets import load_target
from ..logs.logdb import is_measured
from ..logs.manifest import Manifest, ModelEntry


@dataclass(frozen=True, kw_only=True)
class KernelRecord:
    """One plan group with a measured record.

    Attributes
    ----------
    model : str
        The model's source name (``minilm-l3``, a file's stem).
    kernel : str
        The group's kernel name in the plan.
    nodes : tuple of int
        The group's node ids in ``cost_model.graph``.
    meas_us : float
        Mean run time of the best measured record of its workload (the kernel alone).
    cost_model : AnalyticalCostModel
        The analytical model of the graph on the logs' target (``cost_model.hw``).
    logs : str
        The target directory the record came from.
    trials_per_kernel : float
        The model's tuning budget in those logs: its trials / its kernels (a kernel
        measured once or never is not tuned).
    """

    model: str
    kernel: str
    nodes: tuple[int, ...]
    meas_us: float
    cost_model: AnalyticalCostModel
    logs: str
    trials_per_kernel: float = 0.0

    @property
    def analytical_us(self) -> float:
        """The analytical model's time of the kernel alone, as the runner measures it."""
        return kernel_us(self.cost_model.group_cost(self.nodes).total_us, self.cost_model.hw)


def vm_call_us(hw) -> float:
    """The Relax VM's call of a kernel, which MetaSchedule's runner does not time: CPUs
    pay it per kernel (``call_overhead_us``, else ``CPU_CALL_US``); 0 on GPUs, whose
    launches the runner's timings include."""
    if not strategy(hw).fork_join:
        return 0.0
    return CPU_CALL_US if hw.call_overhead_us is None else hw.call_overhead_us


def kernel_us(total_us: float, hw) -> float:
    """A planner ``total_us`` less the VM call: what the runner measures (>= 1 ns)."""
    return max(total_us - vm_call_us(hw), 1e-3)


def best_measured_us(db) -> dict[str, float]:
    """workload key -> mean us of its best verified measured record."""
    out = {}
    for wl in db.workloads():
        recs = [r for r in db.records_of(wl) if is_measured(r.run_secs)]
        if recs:
            secs = [float(s) for s in recs[0].run_secs]
            out[db.workload_key(wl)] = sum(secs) / len(secs) * 1e6
    return out


_GRAPHS: dict[tuple, object] = {}  # (source, shapes, plan's graph signature) -> graph


def _graph_for(entry: ModelEntry, plan, hw):
    """The operator graph the stored plan was made for (simplified or not); one import
    per model and plan signature in a process (a model tuned into several log dirs)."""
    shapes = entry.shape_specs()
    consts = [f"{k}={','.join(map(repr, v))}" for k, v in (entry.consts or {}).items()]
    key = (entry.source, tuple(shapes), tuple(consts), plan.graph_signature)
    if key not in _GRAPHS:
        _GRAPHS[key] = _import_graph(entry.source, shapes, plan, hw, consts)
    return _GRAPHS[key]


def _import_graph(source: str, shapes: list[str], plan, hw, consts: list[str] | None = None):
    from ..kernels import KernelOptions, prepare_kernels
    from ..model_spec import load_model_spec

    # as imported now; before the one-hot gathers, and matmul stacking, existed;
    # unsimplified
    for simplify in (True, {"one_hot": False}, {"stack_matmuls": False, "one_hot": False},
                     False):
        try:
            model = load_model_spec(source, shapes or None, consts or None,
                                    simplify=simplify)
            graph = prepare_kernels(model, hw, None, KernelOptions(plan=plan)).graph
        except TvmFusionError:  # a model file since moved, a name of another session,
            return None         # one tuned with inputs fixed as constants (an If on them)
        if graph.signature == plan.graph_signature:
            return graph
    return None


def model_name(source: str) -> str:
    """The model's name: the zoo name of a zoo model's file (``minilm-l3`` for
    ``paraphrase-MiniLM-L3-v2.onnx``), else the source's stem."""
    from ..zoo import ZOO

    stem = Path(source).stem
    for z in ZOO.values():
        if stem in (z.name, Path(z.member).stem):
            return z.name
    return stem


def kernel_records(tdir: Path, models: list[str] | None = None, *,
                   min_trials_per_kernel: float = 0.0) -> list[KernelRecord]:
    """Every measured kernel of every (selected) model in target directory ``tdir``
    (of models tuned with at least ``min_trials_per_kernel`` trials per kernel).

    A model whose stored plan does not match this tvm-fusion's import of it is skipped
    with a line on stderr.
    """
    tdir = Path(tdir)
    manifest = Manifest.from_json(json.loads((tdir / "manifest.json").read_text()))
    hw = load_target(manifest.target_name)
    best = best_measured_us(_load(tdir))
    out = []
    for entry in manifest.models.values():
        name = model_name(entry.source or "?")
        if models and name not in models and entry.source not in models:
            continue
        kernels = entry.kernels or {}
        budget = float(entry.trials) / max(len(kernels), 1)
        if budget < min_trials_per_kernel:
            continue
        plan = entry.fusion_plan()
        graph = _graph_for(entry, plan, hw)
        if graph is None:
            print(f"# {name}: the model cannot be re-imported, or the stored plan's graph "
                  "is not this tvm-fusion's import of it; skipped", file=sys.stderr)
            continue
        cm = AnalyticalCostModel(graph, hw)
        for g in plan.groups:
            key = kernels[g.name].workload if g.name in kernels else None
            if key in best:
                out.append(KernelRecord(model=name, kernel=g.name, nodes=tuple(g.nodes),
                                        meas_us=best[key], cost_model=cm, logs=str(tdir),
                                        trials_per_kernel=budget))
    return out
