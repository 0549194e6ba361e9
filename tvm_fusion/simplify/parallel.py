"""Parallel matmuls that read the same input (Q/K/V) combined into one wide matmul.

TVM's CombineParallelMatmul only takes weights that are function parameters; weights
here are constants, so their concatenation folds at once: ``matmul(x, W1) ...
matmul(x, Wn)`` becomes ``split(matmul(x, concat(W1..Wn)), axis=-1)``. Each output
column is the same dot product as before, so the result is bit-for-bit the same as far
as the kernels accumulate in the same order.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .block import BlockRewriter, const_value, op_name


def _weight(value) -> np.ndarray | None:
    if op_name(value) != "relax.matmul":
        return None
    w = const_value(value.args[1])
    return w if w is not None and w.ndim == 2 else None


class MatmulCombiner(BlockRewriter):
    """Combine sibling matmuls with constant 2-D weights; counts the matmuls removed."""

    def __init__(self, mod):
        super().__init__(mod)
        self.combined = 0
        self._groups: dict = {}  # first sibling's var -> [sibling vars]
        self._slice: dict = {}   # sibling var -> (split var, index)
        block = mod["main"].body.blocks[0] if mod["main"].body.blocks else None
        if block is None:
            return
        by_input: dict = {}
        for b in block.bindings:
            w = _weight(b.value)
            if w is not None:
                key = (b.value.args[0], w.shape[0], str(w.dtype), str(b.value.attrs.out_dtype))
                by_input.setdefault(key, []).append(b.var)
        for siblings in by_input.values():
            if len(siblings) > 1:
                self._groups[siblings[0]] = siblings

    def rewrite(self, var, value):
        if var in self._slice:
            split, i = self._slice[var]
            return relax.TupleGetItem(split, i)
        siblings = self._groups.get(var)
        if siblings is None:
            return None
        values = {b.var: b.value for b in self.mod["main"].body.blocks[0].bindings}
        weights = [const_value(values[v].args[1]) for v in siblings]
        wide = relax.const(np.concatenate(weights, axis=1))
        out = self.emit(relax.op.matmul(self.arg(value.args[0]), wide), "combined")
        cuts = list(np.cumsum([w.shape[1] for w in weights])[:-1])
        split = self.emit(relax.op.split(out, [int(c) for c in cuts], axis=-1), "parts")
        for i, v in enumerate(siblings[1:], start=1):
            self._slice[v] = (split, i)
        self.combined += len(siblings) - 1
        return relax.TupleGetItem(split, 0)
