"""Apply a fusion plan: outline each group into one kernel.

Each group of two or more operators becomes a Relax function marked ``Primitive``
(exactly what FuseOps emits), then TVM's FuseTIR merges its call_tirs into one PrimFunc.
Any partition works, not only FuseOps' own, as long as every group is convex (no path
leaves a group and comes back into it). The ``TupleGetItem`` glue that takes one piece
of a multi-output op (a Split) goes with the op: into every group that computes it, so
readers in the group take the piece inside and readers elsewhere get it as one more
output of that kernel. Library nodes (sort/scan ops, runtime calls) stay as they are,
one kernel each, lowered by TVM at build time. A group of independent siblings (several
unconnected parts) gets one loop nest (:func:`~tvm_fusion.plan.horizontal.
merge_sibling_nests`); its parts' outputs are returned as a tuple, like any
multi-output group.
"""

from __future__ import annotations

import heapq

import tvm
from tvm import relax, s_tir
from tvm.s_tir.schedule import ScheduleError

from ..errors import PlanError
from ..graph import OpGraph
from ..graph.op_graph import _is_call_tir, is_node_binding
from .fusion_plan import FusionPlan
from .horizontal import components, merge_sibling_nests


DUPLICABLE_KINDS = ("elemwise", "broadcast", "injective")  # cheap to recompute


def check_plan(graph: OpGraph, plan: FusionPlan) -> None:
    """Raise :class:`PlanError` unless ``plan`` covers exactly ``graph``'s nodes.

    Every node is in at least one group; a node in several groups (a duplicated
    producer, recomputed by each) must be elementwise, broadcast or injective, and
    appear at most once per group.
    """
    if plan.graph_signature != graph.signature:
        raise PlanError(
            f"the plan was made for graph {plan.graph_signature}, this model's graph is "
            f"{graph.signature}: the model, its input shapes or the importer changed. "
            "Re-plan (and re-tune) for this model.")
    seen = [n for g in plan.groups for n in g.nodes]
    want = {n.id for n in graph.nodes}
    twice = sorted({n for g in plan.groups for n in g.nodes if g.nodes.count(n) > 1})
    costly = sorted({n for n in seen if seen.count(n) > 1 and n in want
                     and graph.nodes[n].kind not in DUPLICABLE_KINDS})
    if set(seen) != want or twice or costly:
        extra = sorted(set(seen) - want)
        missing = sorted(want - set(seen))
        raise PlanError(f"the plan does not cover the graph's {len(want)} nodes: "
                        f"missing {missing[:10]}, unknown {extra[:10]}, twice in one group "
                        f"{twice[:10]}, in several groups but not elementwise/broadcast/"
                        f"injective {costly[:10]}")
    grouped = sorted({n for g in plan.groups if len(g.nodes) > 1 for n in g.nodes
                      if graph.nodes[n].library or graph.nodes[n].data_dependent})
    if grouped:
        node = graph.nodes[grouped[0]]
        raise PlanError(f"{node.op}#{node.id} is in a group with other operators, but it "
                        f"cannot share a kernel: data-dependent output ({node.data_dependent})."
                        " Put it in a group of its own (re-plan)")


def _free_inputs(values, defined) -> list:
    """Vars and constants used by ``values`` and not defined by ``defined``, in order."""
    found: dict = {}
    for value in values:
        if isinstance(value, relax.TupleGetItem):  # glue: its tuple is made in the group
            continue
        for arg in value.args[1].fields:
            if isinstance(arg, relax.Var) and arg not in defined:
                found.setdefault(arg, None)
            elif not isinstance(arg, relax.Var) and arg not in found:
                found[arg] = None  # a constant: becomes a parameter, as FuseOps does
    return list(found)


def _retarget(call, mapping: dict):
    if isinstance(call, relax.TupleGetItem):
        return relax.TupleGetItem(mapping[call.tuple_value], call.index)
    args = relax.Tuple([mapping.get(a, a) for a in call.args[1].fields])
    return relax.Call(call.op, [call.args[0], args], call.attrs, call.ty_args)


def _outline(bindings, escaping, name):
    """Build the Primitive function of one group; return it and its arguments."""
    defined = {b.var for b in bindings}
    inputs = _free_inputs([b.value for b in bindings], defined)
    params = [relax.Var(f"p_{i}", a.ty) for i, a in enumerate(inputs)]
    mapping = dict(zip(inputs, params))
    body, outs = [], []
    for b in bindings:
        is_out = b.var in escaping
        var = (relax.Var if is_out else relax.DataflowVar)(b.var.name, b.var.ty)
        body.append(relax.VarBinding(var, _retarget(b.value, mapping)))
        mapping[b.var] = var
        if is_out:
            outs.append((b.var, var))
    result = outs[0][1] if len(outs) == 1 else relax.Tuple([v for _, v in outs])
    ret_ty = result.ty if len(outs) == 1 else relax.TupleType([v.ty for _, v in outs])
    func = relax.Function(params, relax.SeqExpr([relax.DataflowBlock(body)], result), ret_ty)
    func = func.with_attr("Primitive", 1).with_attr("global_symbol", name)
    return func, inputs, [orig for orig, _ in outs]


def drop_unread_blocks(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """Remove the blocks of ``func`` whose results nothing reads: the pieces of a fused
    Split that no member of the group takes (FuseTIR keeps them, and their buffers)."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    root = sch.get_sblock("root")
    while True:
        private = list(sch.get(root).alloc_buffers)
        blocks = sch.get_child_blocks(root)
        read = {r.source for b in blocks for r in sch.get(b).reads}
        dead = [b for b in blocks if (w := [x.source for x in sch.get(b).writes])
                and all(any(x.same_as(p) for p in private) for x in w)
                and not any(x.same_as(r) for x in w for r in read)]
        if not dead:
            return sch.mod["main"]
        sch.compute_inline(dead[0])  # no consumer: the block and its buffer go away


def apply_plan(graph: OpGraph, plan: FusionPlan) -> tvm.IRModule:
    """Outline every group of ``plan`` into one fused PrimFunc.

    Parameters
    ----------
    graph : OpGraph
        The graph the plan was made for (``build_graph`` output).
    plan : FusionPlan
        Any partition of the graph's nodes into convex groups; a cheap node may be in
        several groups (each recomputes it, see :func:`check_plan`).

    Returns
    -------
    tvm.IRModule
        ``main`` calls one PrimFunc per kernel of the plan.
    """
    check_plan(graph, plan)
    mod = graph.mod
    main = mod["main"]
    block_idx = [i for i, b in enumerate(main.body.blocks) if isinstance(b, relax.DataflowBlock)][0]
    block = main.body.blocks[block_idx]
    bindings = list(block.bindings)
    node_binding = [i for i, b in enumerate(bindings) if is_node_binding(b)]
    defined_at = {b.var: bi for bi, b in enumerate(bindings)}

    # Units: a whole group, or one binding outside any multi-node group. A duplicated
    # node's binding is in every unit that computes it; one of them (a standalone
    # binding if there is one, else the first group) exports it to the other readers.
    units_of: dict[int, list] = {bi: [] for bi in range(len(bindings))}
    for gi, g in enumerate(plan.groups):
        for n in g.nodes:
            bi = node_binding[n]
            units_of[bi].append(("g", gi) if len(g.nodes) > 1 else bi)
    members: dict[object, list[int]] = {}
    for bi, b in enumerate(bindings):  # a piece of a multi-output op goes with the op
        src = b.value.tuple_value if isinstance(b.value, relax.TupleGetItem) else None
        if src is not None and src in defined_at and _is_call_tir(bindings[defined_at[src]].value):
            owners = units_of[defined_at[src]]
            units_of[bi] = ([bi] if any(not isinstance(u, tuple) for u in owners) else []) \
                + [u for u in owners if isinstance(u, tuple)]
    for bi, units in units_of.items():
        if not units:  # glue outside the op graph (tuples): its own unit
            units.append(bi)
        units.sort(key=lambda u: isinstance(u, tuple))  # standalone first, then plan order
        for u in dict.fromkeys(units):
            members.setdefault(u, []).append(bi)

    def_units = {b.var: units_of[bi] for bi, b in enumerate(bindings)}
    exporter = {var: units[0] for var, units in def_units.items()}
    used_by: dict = {}  # var -> units that read it without computing it
    deps: dict[object, set] = {u: set() for u in members}
    for u, bis in members.items():
        for bi in bis:
            def visit(e, u=u):
                if isinstance(e, relax.Var) and e in def_units and u not in def_units[e]:
                    used_by.setdefault(e, set()).add(u)
                    deps[u].add(exporter[e])
            relax.analysis.post_order_visit(bindings[bi].value, visit)
    # a run-time shape's symbolic dims are bound by a match_cast: keep its users after it
    sym_def: dict = {}
    for bi, b in enumerate(bindings):
        for v in relax.analysis.tir_vars_in_type(b.var.ty):
            first = sym_def.setdefault(v, units_of[bi][0])
            deps.update({u: deps[u] | {first} for u in units_of[bi] if u != first})
    out_vars = set()
    relax.analysis.post_order_visit(
        main.body.body, lambda e: out_vars.add(e) if isinstance(e, relax.Var) else None)
    for later in main.body.blocks[block_idx + 1:]:
        for b in later.bindings:
            relax.analysis.post_order_visit(
                b.value, lambda e: out_vars.add(e) if isinstance(e, relax.Var) else None)

    # Topological order of units (Kahn), keeping the original order where free.
    order, indeg = [], {u: len(d) for u, d in deps.items()}
    rdeps: dict = {u: [] for u in members}
    for u, d in deps.items():
        for v in d:
            rdeps[v].append(u)
    heap = [(min(members[u]), str(u), u) for u, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    while heap:
        _, _, u = heapq.heappop(heap)
        order.append(u)
        for w in rdeps[u]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (min(members[w]), str(w), w))
    if len(order) != len(members):
        bad = [plan.groups[u[1]].name for u in members if isinstance(u, tuple) and indeg[u] > 0]
        raise PlanError(f"groups {bad[:5]} are not convex: a path leaves and re-enters them; "
                        "split them or add the operators on that path")

    bb = relax.BlockBuilder(mod)
    new_bindings = []
    for u in order:
        if not isinstance(u, tuple):
            new_bindings.append(bindings[u])
            continue
        group = plan.groups[u[1]]
        gb = [bindings[bi] for bi in members[u]]
        escaping = {b.var for b in gb
                    if exporter[b.var] == u and (b.var in out_vars or b.var in used_by)}
        if not escaping:
            raise PlanError(f"group {group.name} computes nothing that is used")
        func, args, outs = _outline(gb, escaping, group.name)
        gv = bb.add_func(func, group.name)
        call = relax.Call(gv, args)
        if len(outs) == 1:
            new_bindings.append(relax.VarBinding(outs[0], call))
        else:
            tup = relax.DataflowVar(f"{group.name}_out", func.ret_ty)
            new_bindings.append(relax.VarBinding(tup, call))
            new_bindings += [relax.VarBinding(v, relax.TupleGetItem(tup, i))
                             for i, v in enumerate(outs)]
    blocks = list(main.body.blocks)
    blocks[block_idx] = relax.DataflowBlock(new_bindings)
    new_main = relax.Function(main.params, relax.SeqExpr(blocks, main.body.body),
                              main.ret_ty, main.is_pure, main.attrs)
    out = bb.get()
    out["main"] = new_main
    out = tvm.transform.Sequential([
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])(out)
    for g in plan.groups:
        if len(g.nodes) > 1 and any(len(graph.nodes[n].results) > 1 for n in g.nodes):
            gv = out.get_global_var(g.name)
            out[gv] = drop_unread_blocks(out[gv])
        if len(g.nodes) > 1 and len(components(graph, g.nodes)) > 1:
            gv = out.get_global_var(g.name)
            try:
                out[gv] = merge_sibling_nests(out[gv])
            except ScheduleError:  # a hand-made group: keep its nests (correct, not merged)
                pass
    return out
