"""Parallel matmuls that read the same input (Q/K/V) combined into one wide matmul.

TVM's CombineParallelMatmul only takes weights that are function parameters; weights
here are constants, so their concatenation folds at once: ``matmul(x, W1) ...
matmul(x, Wn)`` becomes ``split(matmul(x, concat(W1..Wn)), axis=-1)``. When every
sibling's one reader adds a constant bias along its output columns, the biases are
concatenated too (``split(matmul(x, W) + b)``), so the bias stays in the wide matmul's
epilogue. Each output column is the same dot product and the same addition as before.

Whether one wide matmul beats n narrow ones depends on the target: :func:`parallel_matmuls`
lists the candidates and :func:`combine_matmuls` combines a chosen few; the planner
decides by predicted time (:mod:`tvm_fusion.plan.combine`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax

from .block import BlockRewriter, const_value, op_name, shape_of, single_block


@dataclass(frozen=True, kw_only=True)
class ParallelMatmuls:
    """Matmuls with constant 2-D weights reading one input, in binding order.

    Attributes
    ----------
    index : int
        Position among the candidates of the module (:func:`parallel_matmuls`).
    names : tuple of str
        The matmuls' Relax variables in ``main`` (a stored plan names them to rebuild).
    widths : tuple of int
        Output columns of each.
    inner : int
        The contraction length (rows of each weight).
    bias : bool
        Each one's single reader adds a constant bias, which the combine takes along.
    """

    index: int
    names: tuple[str, ...]
    widths: tuple[int, ...]
    inner: int
    bias: bool


def _weight(value) -> np.ndarray | None:
    if op_name(value) != "relax.matmul":
        return None
    w = const_value(value.args[1])
    return w if w is not None and w.ndim == 2 else None


def _bias_of(value, var, width: int) -> np.ndarray | None:
    """The constant of ``add(var, c)`` (either order) when ``c`` runs along the last
    axis only (shape ``(width,)`` or ``(1, ..., width)``), as a 1-D array."""
    if op_name(value) != "relax.add":
        return None
    a, b = value.args
    c = b if a.same_as(var) else a if b.same_as(var) else None
    arr = const_value(c) if c is not None else None
    if arr is None or arr.ndim < 1 or arr.shape[-1] != width or arr.size != width:
        return None
    if shape_of(value) != shape_of(var):  # the add must not broadcast the matmul out
        return None
    return arr.reshape(width)


def _scan(mod):
    """(candidates, siblings' values, bias adds) of ``main``; bias adds map a sibling
    var to (the add's var, its 1-D bias)."""
    block = single_block(mod["main"])
    if block is None:
        return [], {}, {}
    values = {b.var: b.value for b in block.bindings}
    readers: dict = {}
    for b in block.bindings:
        relax.analysis.post_order_visit(
            b.value, lambda e, v=b.var: readers.setdefault(e, []).append(v)
            if isinstance(e, relax.Var) else None)
    outputs = set()
    relax.analysis.post_order_visit(
        mod["main"].body.body, lambda e: outputs.add(e) if isinstance(e, relax.Var) else None)
    by_input: dict = {}
    for b in block.bindings:
        w = _weight(b.value)
        if w is not None:
            key = (b.value.args[0], w.shape[0], str(w.dtype), str(b.value.attrs.out_dtype))
            by_input.setdefault(key, []).append(b.var)
    found, adds = [], {}
    for (_, inner, _, _), siblings in by_input.items():
        if len(siblings) < 2:
            continue
        widths = [int(const_value(values[v].args[1]).shape[1]) for v in siblings]
        biases = {}
        for v, n in zip(siblings, widths):
            users = readers.get(v, [])
            if len(users) == 1 and v not in outputs:
                bias = _bias_of(values[users[0]], v, n)
                if bias is not None:
                    biases[v] = (users[0], bias)
        bias = len(biases) == len(siblings)
        if bias:
            adds.update(biases)
        found.append((siblings, widths, inner, bias))
    found.sort(key=lambda f: list(values).index(f[0][0]))
    groups = [ParallelMatmuls(index=i, names=tuple(v.name for v in s), widths=tuple(w),
                              inner=int(k), bias=b)
              for i, (s, w, k, b) in enumerate(found)]
    return list(zip(groups, (f[0] for f in found))), values, adds


def parallel_matmuls(mod) -> tuple[ParallelMatmuls, ...]:
    """The groups of matmuls in ``main`` that :func:`combine_matmuls` can combine."""
    return tuple(g for g, _ in _scan(mod)[0])


class MatmulCombiner(BlockRewriter):
    """Combine sibling matmuls with constant 2-D weights; counts the matmuls removed.

    ``only``: indices of the groups (:attr:`ParallelMatmuls.index`) to combine; None
    combines every group.
    """

    def __init__(self, mod, only=None):
        super().__init__(mod)
        self.combined = 0
        self.groups: tuple[ParallelMatmuls, ...] = ()
        # per combined group: the Relax names it replaced (siblings, bias adds) and the
        # names of what it emitted, so a planner can tell each group's kernels apart
        self.replaced: dict[int, tuple[str, ...]] = {}
        self.emitted: dict[int, tuple[str, ...]] = {}
        self._first: dict = {}   # first sibling's var -> (group, [sibling vars])
        self._slice: dict = {}   # replaced var (sibling, or its bias add) -> (split, index)
        scanned, self._values, adds = _scan(mod)
        self.groups = tuple(g for g, _ in scanned)
        for g, siblings in scanned:
            if only is None or g.index in only:
                self._first[siblings[0]] = (g, siblings)
        self._adds = adds

    def rewrite(self, var, value):
        if var in self._slice:
            split, i = self._slice[var]
            return relax.TupleGetItem(split, i)
        if var not in self._first:
            return None
        group, siblings = self._first[var]
        weights = [const_value(self._values[v].args[1]) for v in siblings]
        name = f"combined{group.index}"  # one name per group (names are not uniquified)
        out = self.emit(relax.op.matmul(self.arg(value.args[0]),
                                        relax.const(np.concatenate(weights, axis=1))), name)
        emitted = [out]
        ends = siblings
        if group.bias:
            bias = np.concatenate([self._adds[v][1] for v in siblings])
            out = self.emit(relax.op.add(out, relax.const(bias.astype(weights[0].dtype))),
                            f"{name}_bias")
            emitted.append(out)
            ends = [self._adds[v][0] for v in siblings]
        cuts = [int(c) for c in np.cumsum(group.widths)[:-1]]
        split = self.emit(relax.op.split(out, cuts, axis=-1), f"{name}_parts")
        emitted.append(split)
        for i, v in enumerate(ends):
            self._slice[v] = (split, i)
        self.replaced[group.index] = tuple(v.name for v in dict.fromkeys((*siblings, *ends)))
        self.emitted[group.index] = tuple(v.name for v in emitted)
        self.combined += len(siblings) - 1
        if group.bias:  # the sibling itself is now read by nothing: dead code
            return None
        return relax.TupleGetItem(split, 0)


def combine_matmuls(mod, only=None):
    """``mod`` with the parallel matmul groups ``only`` (indices, None: all) combined.

    Returns
    -------
    (tvm.IRModule, int)
        The module (dead siblings removed) and the number of matmuls merged away.
    """
    new, combiner = traced_combine(mod, only)
    return new, combiner.combined


def traced_combine(mod, only=None):
    """As :func:`combine_matmuls`, with the combiner: its ``replaced`` and ``emitted``
    name, per combined group, the Relax variables that group removed and added."""
    combiner = MatmulCombiner(mod, only)
    new = combiner.run()
    return relax.transform.DeadCodeElimination()(
        relax.transform.CanonicalizeBindings()(new)), combiner
