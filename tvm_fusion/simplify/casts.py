"""Cast elimination: identity casts and exact round trips through a wider type.

Both only remove work, so the result is bit-for-bit the same:

- ``astype(x, t)`` where ``x`` already is ``t``;
- ``astype(astype(x, wide), t)`` where ``x`` is ``t`` and ``wide`` holds every value of
  ``t`` (int8 -> int32 -> int8, uint8 -> int16 -> uint8, float16 -> float32 -> float16).
"""

from __future__ import annotations

import tvm

from .block import BlockRewriter, dtype_of, op_name


def holds_all_of(wide: str, narrow: str) -> bool:
    """Whether every value of dtype ``narrow`` converts to ``wide`` and back unchanged."""
    w, n = tvm.DataType(wide), tvm.DataType(narrow)
    if w.lanes != 1 or n.lanes != 1:
        return False
    ints = {0: "int", 1: "uint"}  # DataType.type_code: kInt, kUInt
    if n.type_code in ints and w.type_code in ints:
        if n.type_code == w.type_code:
            return w.bits > n.bits
        return w.type_code == 0 and w.bits > n.bits  # unsigned into a wider signed
    ieee = ("float16", "float32", "float64")
    if str(n) in ieee and str(w) in ieee:
        return w.bits > n.bits  # IEEE widening is exact, narrowing back restores it
    return False


class CastEliminator(BlockRewriter):
    """Drop identity casts and exact round-trip casts; counts each kind."""

    def __init__(self, mod):
        super().__init__(mod)
        self.identity = 0
        self.round_trip = 0

    def rewrite(self, var, value):
        if op_name(value) != "relax.astype":
            return None
        src = self.arg(value.args[0])
        to = str(value.attrs.dtype)
        if dtype_of(src) == to:
            self.identity += 1
            return src
        inner = self.producer(src)
        if op_name(inner) == "relax.astype":
            orig = inner.args[0]
            if dtype_of(orig) == to and holds_all_of(dtype_of(src), to):
                self.round_trip += 1
                return orig
        return None
