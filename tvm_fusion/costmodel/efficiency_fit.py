"""Fit the CPU compute term's efficiencies (:mod:`tvm_fusion.plan.cpu_efficiency`) to
measured tuned kernels.

A group's compute time is linear in the reciprocals of the four compute shares:
``compute = c_gemm / gemm + c_depthwise / depthwise + c_vector / vector + c_conv_nchw /
conv_nchw`` (``c_*``: its FLOPs of each kind at peak, after lane and accumulator use),
and its memory time is its bytes' time at the copy rate, over one of the three
bandwidth shares (``reduction``, ``reduction_vector``, ``strided``) for a kernel of that
memory kind (:meth:`~tvm_fusion.plan.AnalyticalCostModel.memory_kind`).
:func:`efficiency_terms` reads the ``c_*`` of every record from the analytical model
itself (five evaluations
of the group, so recomputed FLOPs and every rule count as the planner counts them), and
the kernel's time as the runner measures it is then
``max(compute, memory) / parallel_fraction + launch - VM call``, as in
:mod:`tvm_fusion.plan.cost`. :func:`fit_cpu_efficiency` picks the shares that minimize
the mean absolute log error over the records (coordinate descent on a log grid: four
numbers, no optimizer dependency). ``tvm-fusion calibrate --logs DIR`` writes them into
a target file; ``benchmarks/group_model.py`` scores them leave-one-model-out.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np

from ..errors import CostModelError
from ..family import strategy
from ..plan import AnalyticalCostModel
from ..plan.cpu_efficiency import MEMORY_KINDS, CpuEfficiency
from .group_data import KernelRecord, vm_call_us

SHARES = ("gemm", "depthwise", "vector", "conv_nchw")
_GRID = np.exp(np.linspace(np.log(0.005), 0.0, 161))  # candidate shares, 0.5% .. 100%
ROUNDS = 6


def with_cpu_efficiency(hw, eff: CpuEfficiency, *, source: str | None = None):
    """``hw`` with ``eff`` as its ``cpu_efficiency`` (its values hash changes, its hardware
    hash does not: the shares are a calibration)."""
    sources = dict(hw.sources)
    sources["cpu_efficiency"] = source or eff.source or "fitted"
    return dataclasses.replace(hw, cpu_efficiency=MappingProxyType(eff.to_json()),
                               sources=MappingProxyType(sources))


@dataclasses.dataclass(frozen=True)
class EfficiencyTerms:
    """Per record: FLOP time at peak by kind (us), memory and launch us, parallel
    fraction, VM call us and the measured us."""

    c: np.ndarray          # (records, 4): c_gemm, c_depthwise, c_vector, c_conv_nchw
    memory: np.ndarray     # at the full copy rate
    memory_kind: np.ndarray  # int: 0 the copy rate, k the share MEMORY_KINDS[k - 1]
    frac: np.ndarray       # the parallel schedule's
    launch: np.ndarray     # the parallel schedule's
    call: np.ndarray
    meas: np.ndarray
    units: np.ndarray      # cores: the serial schedule runs the FLOPs on one
    in_l2: np.ndarray      # bool: its bytes fit one core's L2 (one core moves them alone)

    def predict(self, eff: CpuEfficiency) -> np.ndarray:
        """Kernel-alone times (us) the analytical model gives with ``eff``."""
        shares = np.array([eff.nchw_conv if k == "conv_nchw" else getattr(eff, k)
                           for k in SHARES] + [eff.memory_share(k) for k in MEMORY_KINDS])
        return self._predict(shares)

    def _predict(self, shares: np.ndarray) -> np.ndarray:
        compute = (self.c / shares[:len(SHARES)]).sum(axis=1)
        share = np.append(1.0, shares[len(SHARES):])[self.memory_kind]
        memory = self.memory / share
        # a strided kernel's FLOPs run at its share too (AnalyticalCostModel.memory_kind)
        compute = np.where(self.memory_kind == _memory_index("strided"), compute / share,
                           compute)
        parallel = np.maximum(compute, memory) / self.frac + self.launch
        serial = np.maximum(compute * self.units,  # as group_cost
                            np.where(self.in_l2, memory, memory * self.units)) + self.call
        return np.maximum(np.minimum(parallel, serial) - self.call, 1e-3)


def _memory_index(kind: str | None) -> int:
    return 0 if kind is None else MEMORY_KINDS.index(kind) + 1


def efficiency_terms(records: list[KernelRecord], *, accumulators: float = 8.0
                     ) -> EfficiencyTerms:
    """The :class:`EfficiencyTerms` of the CPU records of ``records``."""
    rows = []
    for r in records:
        hw = r.cost_model.hw
        if not strategy(hw).fitted_efficiency:
            continue
        models = []
        for shares in [(1,) * len(SHARES)] + [tuple(0.5 if j == k else 1 for j in
                                                   range(len(SHARES)))
                                             for k in range(len(SHARES))]:
            eff = CpuEfficiency(**dict(zip(SHARES, shares)), accumulators=accumulators)
            cm = AnalyticalCostModel(r.cost_model.graph, with_cpu_efficiency(hw, eff),
                                     r.cost_model.infos)
            models.append(cm.group_cost(r.nodes))
        base, units = models[0], max(hw.compute_units, 1)
        rows.append(([m.compute_us - base.compute_us for m in models[1:]], base.memory_us,
                     _memory_index(cm.memory_kind(r.nodes)), min(1.0, base.tiles / units),
                     cm.launch_us(r.nodes), vm_call_us(hw), r.meas_us, units,
                     cm.footprint(r.nodes, spill_bytes=base.spill_bytes)
                     <= cm.core_l2_bytes()))
    if not rows:
        raise CostModelError("no measured CPU kernels to fit the compute efficiency on; "
                             "pass tuning logs of a CPU target (tvm-fusion tune --logs DIR)")
    cols = list(zip(*rows))
    return EfficiencyTerms(c=np.array(cols[0], dtype=float),
                           memory_kind=np.array(cols[2], dtype=int),
                           in_l2=np.array(cols[-1], dtype=bool),
                           **{k: np.array(v, dtype=float) for k, v in zip(
                               ("memory", "frac", "launch", "call", "meas", "units"),
                               cols[1:2] + cols[3:-1])})


def fit_cpu_efficiency(terms: EfficiencyTerms, *, accumulators: float = 8.0,
                       source: str = "") -> CpuEfficiency:
    """The shares minimizing the mean |log(predicted / measured)| over ``terms``.

    A kind no record has (no depthwise conv) keeps share 1 divided into nothing: its
    value is left at the median of the others' (it does not change any prediction);
    ``conv_nchw`` is left out (None: such convs take the ``gemm`` share), and so is a
    bandwidth share no record has (None: 1).
    """
    log_meas = np.log(terms.meas)
    shares = np.full(len(SHARES) + len(MEMORY_KINDS), 0.3)
    shares[len(SHARES):] = 1.0

    def loss(s):
        return np.abs(np.log(terms._predict(s)) - log_meas).mean()

    present = np.append(terms.c.sum(axis=0) > 0,
                        [(terms.memory_kind == k + 1).any() for k in range(len(MEMORY_KINDS))])
    for _ in range(ROUNDS):
        for k in np.flatnonzero(present):
            trial = np.repeat(shares[None, :], len(_GRID), axis=0)
            trial[:, k] = _GRID
            losses = np.array([loss(t) for t in trial])
            # of equal losses (a share no record's time depends on), the one nearest the
            # start (0.3, or 1 for a memory share): never the grid's 0.5% by default
            ties = np.flatnonzero(losses <= losses.min() + 1e-12)
            shares[k] = _GRID[ties[np.argmin(np.abs(np.log(_GRID[ties] / shares[k])))]]
    compute = present[:len(SHARES)]
    if compute.any() and not compute.all():
        shares[:len(SHARES)][~compute] = float(np.median(shares[:len(SHARES)][compute]))
    fitted = {k: float(v) for k, v in zip(SHARES + MEMORY_KINDS, shares)}
    if not present[SHARES.index("conv_nchw")]:
        fitted["conv_nchw"] = None  # no NCHW conv measured: such convs take the gemm share
    for k, kind in enumerate(MEMORY_KINDS):
        if not present[len(SHARES) + k]:
            fitted[kind] = None  # no such kernel measured: its bytes at the copy rate
    return CpuEfficiency(**fitted, accumulators=accumulators, source=source)
