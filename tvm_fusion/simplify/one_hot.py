"""A one-hot matrix times a constant table, as the gather it is.

Exporters write an embedding lookup as ``one_hot(ids) @ W``: jax2tf compares the ids
against ``arange(depth)`` (``equal``), casts the booleans to floats, and multiplies by
the ``[depth, N]`` table. Magika's first kernel is such a product, a 2048 x 257 @ 257 x 64
GEMM (67 MFLOP, K = 257 prime): 4.0 ms at its best of 4 trials, where the rows it selects
are 512 KB of copies. ``take(W, ids)`` gives each output row the same value (the one row
with a 1, plus zeros). An id outside ``[0, depth)`` has an all-zero one-hot row: it reads
a zero row appended to the table.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .block import const_value, dtype_of, shape_of


def one_hot_matmuls_as_gathers(mod, cleanup) -> tuple[object, int]:
    """``mod`` with each ``astype(equal(ids, arange(depth))) @ W`` of a constant ``W`` a
    ``take`` of ``W`` (one zero row appended); ``(module, products rewritten)``."""
    ids, iota, table = wildcard(), wildcard(), wildcard()
    pattern = is_op("relax.matmul")(is_op("relax.astype")(is_op("relax.equal")(ids, iota)),
                                    table)
    found = [0]

    def rewrite(expr, m):
        w = const_value(m[table])
        onehot = expr.args[0]
        if w is None or w.ndim != 2 or dtype_of(onehot) != str(w.dtype):
            return expr
        depth = w.shape[0]
        # either operand order of the comparison
        for x, c in ((m[ids], m[iota]), (m[iota], m[ids])):
            arange = const_value(c)
            shape = shape_of(x)
            if arange is None or shape is None or not dtype_of(x).startswith(("int", "uint")):
                continue
            if arange.size != depth or arange.shape[-1] != depth or not np.array_equal(
                    arange.reshape(-1), np.arange(depth)) or shape[-1] != 1 \
                    or shape_of(onehot) != shape[:-1] + (depth,):
                continue
            found[0] += 1
            idx = relax.op.reshape(x, shape[:-1])
            dtype = dtype_of(x)
            inside = relax.op.logical_and(relax.op.greater_equal(idx, relax.const(0, dtype)),
                                          relax.op.less(idx, relax.const(depth, dtype)))
            safe = relax.op.where(inside, idx, relax.const(depth, dtype))
            padded = np.concatenate([w, np.zeros((1, w.shape[1]), w.dtype)])
            return relax.op.take(relax.const(padded), safe, axis=0)
        return expr

    main = rewrite_call(pattern, rewrite, mod["main"])
    if not found[0]:
        return mod, 0
    out = mod.clone() if hasattr(mod, "clone") else type(mod)(mod.functions, attrs=mod.attrs)
    out["main"] = main
    return cleanup(out), found[0]
