"""Matmuls of one constant weight on independent inputs stacked into one matmul.

A recurrent network exported step by step (an LSTM unrolled into per-step Gemms, as
captcha-crnn's is) projects every time step's input through the same weight:
``x_1 @ W ... x_n @ W``, each a GEMV that reads all of ``W``. captcha-crnn's two
directions read a 6.5 MB weight 20 times each: 40 calls, 4.7 ms of its 13 ms. Where no
``x_i`` depends on another of the products, the products are one matmul of the stacked
inputs: ``split(concat(x_1..x_n) @ W)``, which reads ``W`` once and gives each row the
same dot product as before. A recurrent step's ``h_{t-1} @ U`` depends on the step
before, so those stay apart.

The stacked matmul needs every ``x_i`` before it runs, so the bindings are reordered
(topologically, keeping the model's order where it is free): a product was used before
a later step's input was computed, and that use now waits for the stacked matmul. An
input that depends on one of the products would make that a cycle; such a product
starts a batch of its own.
"""

from __future__ import annotations

import hashlib
import heapq

from tvm import relax

from .block import BlockRewriter, const_value, dtype_of, op_name, shape_of, single_block

MAX_ROUNDS = 64  # batches per model: one rewrite each, the graph re-read after it


def _reads(value) -> list:
    out = []
    relax.analysis.post_order_visit(
        value, lambda e: out.append(e) if isinstance(e, relax.Var) else None)
    return out


def _key(value):
    """What products must share to stack: the weight's bytes, dtypes, the input's shape."""
    if op_name(value) != "relax.matmul":
        return None
    w = const_value(value.args[1])
    shape = shape_of(value.args[0])
    if w is None or w.ndim != 2 or shape is None or len(shape) < 2:
        return None
    digest = hashlib.sha1(w.tobytes()).hexdigest()
    return (digest, w.shape, str(w.dtype), str(value.attrs.out_dtype), shape,
            dtype_of(value.args[0]))


def _find_batch(block) -> list | None:
    """The first run of at least two stackable products (binding order), or None."""
    bindings = list(block.bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    ancestors: list[int] = []  # bitset over binding positions, itself included
    for i, b in enumerate(bindings):
        bits = 1 << i
        for v in _reads(b.value):
            j = index.get(v)
            if j is not None and j < i:
                bits |= ancestors[j]
        ancestors.append(bits)
    groups: dict = {}
    for i, b in enumerate(bindings):
        key = _key(b.value)
        if key is not None:
            groups.setdefault(key, []).append(i)
    for members in sorted(groups.values()):
        left = members
        while len(left) >= 2:
            batch, rest, taken = [], [], 0
            for i in left:
                x = index.get(bindings[i].value.args[0])
                if x is not None and ancestors[x] & taken:
                    rest.append(i)  # its input needs a product of this batch
                    continue
                batch.append(i)
                taken |= 1 << i
            if len(batch) >= 2:
                return [bindings[i] for i in batch]
            left = rest
    return None


class _Stacker(BlockRewriter):
    """Emits ``batch`` as one stacked matmul, each product a part of its split, with the
    bindings reordered so that every input comes before the stacked matmul."""

    def __init__(self, mod, batch, name: str):
        super().__init__(mod)
        self.batch, self.name = batch, name

    def bindings(self, block) -> list:
        members = {b.var: k for k, b in enumerate(self.batch)}
        first = self.batch[0]
        axis = len(shape_of(first.value.args[0])) - 2
        stacked = relax.Var(f"{self.name}_in", None)
        product = relax.Var(self.name, None)
        parts = relax.Var(f"{self.name}_parts", None)
        new = [
            relax.VarBinding(stacked, relax.op.concat(
                relax.Tuple([b.value.args[0] for b in self.batch]), axis=axis)),
            relax.VarBinding(product, relax.op.matmul(
                stacked, first.value.args[1], out_dtype=first.value.attrs.out_dtype)),
            relax.VarBinding(parts, relax.op.split(product, len(self.batch), axis=axis)),
        ]
        nodes = []  # (priority, binding): the model's order where dependencies allow
        for i, b in enumerate(block.bindings):
            if b.var in members:
                b = relax.VarBinding(b.var, relax.TupleGetItem(parts, members[b.var]))
            nodes.append(((i, 1), b))
        at = next(i for i, b in enumerate(block.bindings) if b.var.same_as(first.var))
        nodes += [((at, 0, k), b) for k, b in enumerate(new)]
        return _topological(nodes)


def _topological(nodes) -> list:
    """``nodes`` ((priority, binding)) ordered so that each binding follows the bindings
    whose vars it reads; among the ready ones, the smallest priority first."""
    defined = {b.var: n for n, (_, b) in enumerate(nodes)}
    waits = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for n, (_, b) in enumerate(nodes):
        for dep in {defined[v] for v in _reads(b.value) if v in defined}:
            waits[n] += 1
            users[dep].append(n)
    ready = [(nodes[n][0], n) for n in range(len(nodes)) if waits[n] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(nodes[n][1])
        for u in users[n]:
            waits[u] -= 1
            if waits[u] == 0:
                heapq.heappush(ready, (nodes[u][0], u))
    if len(out) != len(nodes):  # _find_batch rules cycles out; never half a block
        raise ValueError("stacking the shared-weight matmuls would make a cycle")
    return out


def stack_shared_weight_matmuls(mod, cleanup) -> tuple[object, int]:
    """``mod`` with every stackable run of shared-weight products stacked, and the
    number of matmuls merged away; ``cleanup`` is run after each rewrite."""
    merged = 0
    for k in range(MAX_ROUNDS):
        block = single_block(mod["main"])
        batch = block and _find_batch(block)
        if not batch:
            break
        mod = cleanup(_Stacker(mod, batch, f"stacked{k}").run())
        merged += len(batch) - 1
    return mod, merged
