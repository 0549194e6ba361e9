"""The simplification pipeline: TVM's passes and ours, in the order they enable each other."""

from __future__ import annotations

import tvm
from tvm import relax

from .affine import AffineFolder, name_folded_batch_norms
from .block import count_ops, single_block
from .casts import CastEliminator
from .fold import fold_constants
from .line_convs import LineConvs
from .one_hot import one_hot_matmuls_as_gathers
from .parallel import MatmulCombiner
from .qdq import QdqIntegerizer
from .shared_weight import stack_shared_weight_matmuls
from .report import SimplifyReport
from .transposes import TransposeSinker, transposed_elements


def _cleanup(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential([
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ])(mod)


def _line_convs(mod: tvm.IRModule) -> tuple[tvm.IRModule, int, int]:
    """1-D and tiny pointwise convs moved to NHWC (:mod:`.line_convs`), then the
    transposes after them sunk; ``(module, convs moved, transpose pairs cancelled)``.

    Its own sinking pass, after the model's: the keep-or-drop rule of a sinking pass is
    over the whole model, and a line conv's transposes sunk together with the model's
    would let a rewrite that moves more bytes elsewhere pass on what the conv saves.
    """
    lines = LineConvs(mod)
    lined = _cleanup(lines.run())
    if not lines.convs:
        return mod, 0, 0
    sinker = TransposeSinker(lined, from_convs=True)
    sunk = _cleanup(sinker.run())
    if transposed_elements(sunk) <= transposed_elements(lined):
        return sunk, lines.convs, sinker.pairs
    return lined, lines.convs, 0


def simplify_module(mod: tvm.IRModule, *, transposes: bool = True, nhwc: bool = True,
                    affine: bool = True, combine_matmul: bool = False,
                    stack_matmuls: bool = True, one_hot: bool = True,
                    ) -> tuple[tvm.IRModule, SimplifyReport]:
    """Simplify ``main`` of a Relax module; return the new module and what was done.

    Parameters
    ----------
    mod : tvm.IRModule
        A module with ``main`` (``ImportedModel.mod``); weights as constants.
    transposes : bool
        Sink and cancel transposes.
    nhwc : bool
        Let NCHW convs and pools whose input is NHWC data run in NHWC, and 1-D and tiny
        pointwise convs run in NHWC in any case (:mod:`.line_convs`; with
        ``transposes``, which cancels what they can of the transposes around them).
    affine : bool
        Fold batch norms and constant per-channel Mul/Div/Add/Sub into convs and matmuls.
    combine_matmul : bool
        Merge matmuls with constant weights that read the same input (Q/K/V) into one
        (:mod:`.parallel`; TVM's CombineParallelMatmul takes parameter weights only).
        Off by default: whether one wide matmul beats three depends on the target, and
        the planner's cost model is not consulted here.
    stack_matmuls : bool
        Stack matmuls that multiply independent inputs by one constant weight (an
        unrolled RNN's per-step input projections) into one matmul that reads the weight
        once (:mod:`.shared_weight`).
    one_hot : bool
        Make a one-hot matrix times a constant table a gather of the table's rows
        (:mod:`.one_hot`).

    Returns
    -------
    (tvm.IRModule, SimplifyReport)
        A module that computes the same outputs (bit-for-bit for removals and transposes,
        within float rounding for folds) and the counts of each rewrite. A ``main``
        with control flow (no single dataflow block) is returned unchanged.
    """
    ops_before = count_ops(mod)
    counts: dict[str, int] = {"transposes_before": count_ops(mod, "relax.permute_dims")}
    if single_block(mod["main"]) is None:
        return mod, SimplifyReport(ops_before=ops_before, ops_after=ops_before,
                                   transposes_after=counts["transposes_before"], **counts)
    mod = _cleanup(mod)
    counts["dead_ops"] = ops_before - count_ops(mod)
    # Before constant folding: a small weight's dequantize would fold into floats.
    qdq = QdqIntegerizer(mod)
    mod = _cleanup(qdq.run())
    counts["int8_gemms"] = qdq.convs + qdq.matmuls
    if affine:
        n = count_ops(mod, "relax.nn.batch_norm")
        mod = name_folded_batch_norms(mod, relax.transform.FoldBatchnormToConv2D()(mod))
        counts["batch_norms_folded"] = n - count_ops(mod, "relax.nn.batch_norm")
    # Batch norms left (after a conv bias, a matmul...) become constant Sub/Mul/Add chains
    # the affine folder takes; legalization would decompose them anyway.
    mod = relax.transform.DecomposeOpsForInference()(mod)
    n = count_ops(mod)
    mod = _cleanup(fold_constants(mod))
    counts["constants_folded"] = n - count_ops(mod)

    casts = CastEliminator(mod)
    mod = _cleanup(casts.run())
    counts["identity_casts"], counts["round_trip_casts"] = casts.identity, casts.round_trip
    if one_hot:
        mod, counts["one_hot_gathers"] = one_hot_matmuls_as_gathers(mod, _cleanup)

    if transposes:
        sinker = TransposeSinker(mod, nhwc=nhwc)
        sunk = _cleanup(sinker.run())
        if transposed_elements(sunk) <= transposed_elements(mod):
            mod = sunk
            counts["transpose_pairs"], counts["nhwc_ops"] = sinker.pairs, sinker.nhwc_ops
    if transposes and nhwc:
        mod, counts["line_convs"], pairs = _line_convs(mod)
        counts["transpose_pairs"] = counts.get("transpose_pairs", 0) + pairs

    if affine:
        folder = AffineFolder(mod)
        mod = _cleanup(fold_constants(folder.run()))
        counts["affine_ops_folded"], counts["affine_chains"] = folder.ops, len(folder.chains)

    if stack_matmuls:
        mod, counts["matmuls_stacked"] = stack_shared_weight_matmuls(mod, _cleanup)

    if combine_matmul:
        combiner = MatmulCombiner(mod)
        mod = _cleanup(combiner.run())
        counts["matmuls_combined"] = combiner.combined

    n = count_ops(mod)
    mod = _cleanup(relax.transform.EliminateCommonSubexpr()(mod))
    counts["common_subexprs"] = n - count_ops(mod)
    return mod, SimplifyReport(ops_before=ops_before, ops_after=count_ops(mod),
                               transposes_after=count_ops(mod, "relax.permute_dims"),
                               **counts)
