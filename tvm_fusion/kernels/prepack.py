"""Weight prepacking on CPU targets: tune kernels whose constant weights may change layout.

MetaSchedule's ``RewriteLayout`` postprocessor rewrites only the buffers a PrimFunc lists
in its ``layout_free_buffers`` attribute: a tuned schedule then reads its weight in the
layout its loops want (a ``meta_schedule.layout_rewrite_preproc`` block at the top of the
kernel turns the model's layout into it). At build, ``SplitLayoutRewritePreproc`` moves
that block into a kernel of its own, and because our weights are Relax constants
``FoldConstant`` runs it once, so the module carries the packed weights and ``main``
keeps its signature. It is TVM's ``static_shape_tuning_pipeline(cpu_weight_prepack=
True)`` recipe, applied to tvm-fusion's fused module.

Marking changes a kernel's attributes and so its MetaSchedule workload hash: records
tuned with and without prepacking are different workloads. The manifest's model entry
says which (``"prepack": true``); an entry without the field was tuned before prepacking
existed and is applied exactly as before (:func:`resolve_prepack`).
"""

from __future__ import annotations

import re

import tvm
from tvm import relax
from tvm.relax.expr import _update_type

from ..errors import LogError
from ..family import strategy
from ..graph.int8_conv import BLOCK as VNNI_CONV

ATTR = "layout_free_buffers"


def prepack_default(hw) -> bool:
    """Whether tuning ``hw`` prepacks weights when nothing says otherwise: CPUs only."""
    return strategy(hw).weight_prepack


def resolve_prepack(requested: bool | None, entry, hw, *, where) -> bool:
    """The prepack setting to tune or build with.

    Parameters
    ----------
    requested : bool or None
        The user's ``prepack`` argument; None: the entry's setting, else
        :func:`prepack_default`.
    entry : ModelEntry or None
        The model's manifest entry whose records will be used (or continued); one
        without the field predates prepacking (its records are unmarked kernels).
    hw : HardwareTarget
    where : path
        The target directory, for messages.

    Raises
    ------
    LogError
        ``requested`` disagrees with the entry (its records would not apply: another
        workload hash), or prepacking is asked of a GPU target.
    """
    if requested and not strategy(hw).weight_prepack:
        raise LogError(f"weight prepacking is for CPU targets; {hw.name} is a "
                       f"{hw.family} target: drop prepack=True (CLI: --prepack)")
    stored = None if entry is None else entry.tuned_prepack
    if stored is None:
        return prepack_default(hw) if requested is None else bool(requested)
    if requested is not None and bool(requested) != stored:
        how = "with" if stored else "without"
        flag = "--prepack" if requested else "--no-prepack"
        raise LogError(
            f"the records for this model in {where} were tuned {how} weight prepacking, "
            f"and prepack={bool(requested)} ({flag}) would match none of them (prepacked "
            "kernels are other MetaSchedule workloads). Drop the option to use the "
            f"logs' setting, or tune with {flag} into a new log directory")
    return stored


def mark_layout_free(mod: tvm.IRModule) -> tvm.IRModule:
    """Mark, on every PrimFunc, the parameters bound to Relax constants as layout-free.

    What ``relax.transform.AttachAttrLayoutFreeBuffers`` does, but in place: that pass
    gives every marked kernel a new name (``matmul`` becomes ``matmul1``), and here the
    kernel names are the plan's group names and the tuning task names. A kernel called
    at several sites gets the parameters that are constants at every one of them.
    """
    free: dict[str, set[int]] = {}
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op == call_tir:
            name = expr.args[0].name_hint
            args = expr.args[1].fields if isinstance(expr.args[1], relax.Tuple) else []
            consts = {i for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant)}
            free[name] = free[name] & consts if name in free else consts

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    out = mod
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        unsafe = _flipped_params(func) | _sliced_params(func) | _vnni_conv_weights(func)
        idx = sorted(i for i in free.get(gv.name_hint, ()) if i not in unsafe)
        if idx:
            out[gv] = func.with_attr(ATTR, idx)
    return out


def _flipped_params(func: tvm.tirx.PrimFunc) -> set[int]:
    """Parameters some block reads at a flipped index (``p[i, o, 1 - h, 1 - w]``).

    ``conv2d_transpose``'s ``kernel_transform`` reads its weight so. RewriteLayout in TVM
    0.27 infers the packed layout from that read and, when the weight has a unit axis
    (one output channel: PP-OCR det's final ConvTranspose), packs a buffer that drops an
    axis: every candidate then fails verification and the kernel ships untuned (10 of
    ppocr-det's 40 ms). Such weights are left in the model's layout.
    """
    index = {p: i for i, p in enumerate(func.params)}  # a read's source is its param
    expr = tvm.ir.expr.Expr

    def has_var(e) -> bool:
        if isinstance(e, tvm.tirx.Var):
            return True
        return any(has_var(getattr(e, k)) for k in ("a", "b", "value")
                   if isinstance(getattr(e, k, None), expr))

    def flipped(e) -> bool:
        if isinstance(e, tvm.tirx.Sub) and has_var(e.b):
            return True
        return any(flipped(getattr(e, k)) for k in ("a", "b", "value")
                   if isinstance(getattr(e, k, None), expr))

    sch = tvm.s_tir.Schedule(func)
    found: set[int] = set()
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        for read in sch.get(block).reads:
            if read.source in index and any(flipped(r.min) for r in read.region):
                found.add(index[read.source])
    return found


def _vnni_conv_weights(func: tvm.tirx.PrimFunc) -> set[int]:
    """The int8 weight of a ``conv2d_NCHWc_int8`` block (graph/int8_conv.py).

    That weight is packed at plan time already, in the ``(O/16, I/16, KH, KW, 4, 16, 4)``
    layout VNNI's ``vpdpbusd`` reads, so RewriteLayout has little to gain on it; and with
    it marked, tuning QDQ ResNet-50 (and tests/test_int8_resnet.py's head of it: its
    first task, a 1x1 conv with a residual epilogue) crashed after the first batch of
    measurements, in MetaSchedule's ``ArgInfo::FromEntryFunc`` ("Check failed:
    (ind.as<PrimVar>()) is false"), losing the run. It is left unmarked; the kernel's
    other constants (the epilogue's scales and biases) stay marked.
    """
    index = {p: i for i, p in enumerate(func.params)}
    sch = tvm.s_tir.Schedule(func)
    try:
        block = sch.get(sch.get_sblock(VNNI_CONV))
    except (RuntimeError, ValueError):  # TVM 0.27: no block of that name
        return set()
    return {index[r.source] for r in block.reads
            if r.source in index and str(r.source.dtype) == "int8"}


def _sliced_params(func: tvm.tirx.PrimFunc) -> set[int]:
    """Parameters read by an elementwise block whose result, through single-consumer
    elementwise blocks, is read by several blocks at different offsets (a split's
    slices: ``t[.., c]``, ``t[.., c + 384]``, ``t[.., c + 768]``).

    MetaSchedule inlines such a block into each slice, so the parameter is then read at
    several offsets, and RewriteLayout in TVM 0.27 infers one packed layout from one of
    those reads and rewrites all of them with it: MiniLM-L3's Q/K/V matmul + bias + split
    + head transposes read the V and K slices' bias at the Q slice's index, and every
    candidate failed verification (4.6% off; the kernel ran its default loops, 21x the
    model's time). Such parameters are left in the model's layout; a block that reduces
    (the GEMM reading its weight) is never inlined and keeps its weight packed.
    """
    index = {p: i for i, p in enumerate(func.params)}  # a read's source is its param
    sch = tvm.s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]

    def spatial(block) -> bool:
        return all(int(iv.iter_type) == 0 for iv in block.iter_vars)

    def starts(block, buf) -> set[str]:
        """Where ``block`` reads ``buf``, its iteration variables named by position."""
        names = {iv.var.name: f"v{k}" for k, iv in enumerate(block.iter_vars)}
        out = set()
        for read in block.reads:
            if read.source.same_as(buf):
                text = str([r.min for r in read.region])
                for name, pos in names.items():
                    text = re.sub(rf"\b{re.escape(name)}\b", pos, text)
                out.add(text)
        return out

    def fans_out_sliced(block, depth: int = 0) -> bool:
        if depth > len(blocks):
            return False
        for w in block.writes:
            readers = [b for b in blocks if any(r.source.same_as(w.source) for r in b.reads)]
            if len(readers) > 1:
                if len(set().union(*(starts(b, w.source) for b in readers))) > 1:
                    return True
            elif readers and spatial(readers[0]) and fans_out_sliced(readers[0], depth + 1):
                return True
        return False

    found: set[int] = set()
    for block in blocks:
        params = {index[r.source] for r in block.reads if r.source in index}
        if params and spatial(block) and fans_out_sliced(block):
            found |= params
    return found


def has_layout_rewrite(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a scheduled kernel rewrites a weight's layout (has a preproc block).

    RewriteLayout puts the block at the kernel's root, which is where it is looked for.
    """
    if not func.attrs or ATTR not in func.attrs:
        return False
    sch = tvm.s_tir.Schedule(func)
    return any(sch.get(b).annotations.get("meta_schedule.layout_rewrite_preproc")
               for b in sch.get_child_blocks(sch.get_sblock("root")))


def fold_prepacked(mod: tvm.IRModule) -> tvm.IRModule:
    """Split each tuned kernel's layout rewrite off and run it on the constant weights.

    Call inside the target's scope, after ``MetaScheduleApplyDatabase``. Each such kernel
    ``K`` becomes ``K_prepacked``, reading the packed constant that ``K_weight_prepack``
    made at build (that kernel is not in the module). A module with no layout rewrite is
    returned as it is (no ``FoldConstant`` over kernels that have nothing to fold).
    """
    packed = {gv.name_hint for gv, f in mod.functions.items()
              if isinstance(f, tvm.tirx.PrimFunc) and has_layout_rewrite(f)}
    if not packed:
        return mod
    mod = tvm.transform.Sequential([
        relax.transform.SplitLayoutRewritePreproc(),
        relax.transform.LiftTransformParams(),  # a no-op while weights are constants
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),  # folded tuples of packed constants
        relax.transform.DeadCodeElimination(["main"]),  # the weight_prepack kernels
    ])(mod)
    return _rename(mod, {f"{n}_prepacked": n for n in packed})


def constant_shapes(mod: tvm.IRModule, kernels) -> dict[str, list[list[int]]]:
    """Per kernel of ``kernels``: the shapes of the constants ``main`` passes it."""
    out: dict[str, list[list[int]]] = {}
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op == call_tir \
                and expr.args[0].name_hint in kernels:
            args = expr.args[1].fields if isinstance(expr.args[1], relax.Tuple) else []
            out[expr.args[0].name_hint] = [[int(d) for d in a.value.shape] for a in args
                                           if isinstance(a, tvm.ir.Constant)]

    relax.analysis.post_order_visit(mod["main"], visit)
    return out


@relax.expr_functor.mutator
class _Renamer(relax.PyExprMutator):
    def __init__(self, gvars: dict):
        super().__init__()
        self.gvars = gvars

    def visit_global_var_(self, op):
        return self.gvars.get(op.name_hint, op)


def _rename(mod: tvm.IRModule, names: dict[str, str]) -> tvm.IRModule:
    """``mod`` with the functions ``names`` maps renamed, and their callers updated."""
    gvars = {}
    for gv in mod.get_global_vars():
        if gv.name_hint in names:
            gvars[gv.name_hint] = new = tvm.ir.GlobalVar(names[gv.name_hint])
            _update_type(new, gv.ty)  # a GlobalVar a Relax call names must be typed
    renamer = _Renamer(gvars)
    funcs = {gvars.get(gv.name_hint, gv): renamer.visit_expr(f)
             if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
