"""What the simplification stage did to a model: counts per rewrite."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SimplifyReport:
    """Counts of each rewrite of :func:`~tvm_fusion.simplify.simplify_module`.

    Attributes
    ----------
    ops_before, ops_after : int
        Operator calls in ``main`` before and after (TupleGetItem and such not counted).
    identity_casts, round_trip_casts : int
        Casts to the dtype a value already has; cast pairs through a wider type and back.
    transposes_before, transposes_after : int
        Transposes (``permute_dims``) in ``main`` before and after.
    transpose_pairs : int
        Transposes that met their inverse and vanished together.
    nhwc_ops : int
        Convolutions and pools that now run on NHWC data instead of transposing it.
    line_convs : int
        1-D and tiny pointwise convolutions moved to NHWC, where they are GEMMs with the
        output channels in vector lanes (:mod:`.line_convs`).
    batch_norms_folded : int
        BatchNorm ops folded into a preceding conv by TVM's FoldBatchnormToConv2D.
    affine_ops_folded, affine_chains : int
        Constant per-channel Mul/Div/Add/Sub ops folded into conv/matmul weights and
        biases, and the number of conv/matmul ops that took them.
    matmuls_combined : int
        Matmuls merged away by CombineParallelMatmul (only when enabled).
    matmuls_stacked : int
        Matmuls of one constant weight on independent inputs (an unrolled RNN's input
        projections) merged away into one matmul of the stacked inputs.
    one_hot_gathers : int
        One-hot products with a constant table (``one_hot(ids) @ W``, an embedding as
        jax2tf exports it) made gathers of its rows (:mod:`.one_hot`).
    common_subexprs : int
        Duplicate operator calls removed by common subexpression elimination.
    dead_ops : int
        Operator calls the imported module computed but never used.
    constants_folded : int
        Operator calls on constants only, computed at import (shape arithmetic, weight
        transposes, the importer's own constant expressions).
    """

    ops_before: int
    ops_after: int
    identity_casts: int = 0
    round_trip_casts: int = 0
    transposes_before: int = 0
    transposes_after: int = 0
    transpose_pairs: int = 0
    nhwc_ops: int = 0
    line_convs: int = 0
    batch_norms_folded: int = 0
    affine_ops_folded: int = 0
    affine_chains: int = 0
    matmuls_combined: int = 0
    matmuls_stacked: int = 0
    one_hot_gathers: int = 0
    common_subexprs: int = 0
    dead_ops: int = 0
    constants_folded: int = 0
    int8_gemms: int = 0
    """QDQ and MatMulInteger GEMMs rewritten to read their int8 operands (:mod:`.qdq`)."""

    @property
    def changed(self) -> bool:
        """Whether any rewrite fired."""
        return self.ops_before != self.ops_after or any((
            self.identity_casts, self.round_trip_casts, self.transpose_pairs, self.nhwc_ops,
            self.line_convs,
            self.batch_norms_folded, self.affine_ops_folded, self.matmuls_combined,
            self.matmuls_stacked, self.one_hot_gathers, self.int8_gemms,
            self.transposes_before != self.transposes_after))

    def summary(self) -> str:
        """One line, e.g. ``simplified 620 -> 180 ops: removed 298 identity casts, ...``."""
        parts = []
        if self.int8_gemms:
            parts.append(f"made {self.int8_gemms} GEMMs integer (u8 x s8 -> i32)")
        if self.identity_casts:
            parts.append(f"removed {self.identity_casts} identity casts")
        if self.round_trip_casts:
            parts.append(f"removed {self.round_trip_casts} round-trip cast pairs")
        if self.transpose_pairs:
            parts.append(f"cancelled {self.transpose_pairs} transpose pairs")
        if self.transposes_before != self.transposes_after:
            parts.append(f"transposes {self.transposes_before} -> {self.transposes_after}")
        if self.nhwc_ops:
            parts.append(f"{self.nhwc_ops} convs/pools kept in NHWC")
        if self.line_convs:
            parts.append(f"{self.line_convs} 1-D/pointwise convs moved to NHWC")
        if self.batch_norms_folded:
            parts.append(f"folded {self.batch_norms_folded} batch norms into convs")
        if self.affine_ops_folded:
            parts.append(f"folded {self.affine_ops_folded} affine ops ({self.affine_chains} "
                         "chains) into conv/matmul weights")
        if self.matmuls_combined:
            parts.append(f"combined {self.matmuls_combined} parallel matmuls")
        if self.matmuls_stacked:
            parts.append(f"stacked {self.matmuls_stacked} shared-weight matmuls on "
                         "independent inputs into one")
        if self.one_hot_gathers:
            parts.append(f"made {self.one_hot_gathers} one-hot matmuls gathers of table rows")
        if self.common_subexprs:
            parts.append(f"merged {self.common_subexprs} common subexpressions")
        if self.dead_ops:
            parts.append(f"removed {self.dead_ops} dead ops")
        if self.constants_folded:
            parts.append(f"computed {self.constants_folded} ops on constants at import")
        head = f"simplified {self.ops_before} -> {self.ops_after} ops"
        return f"{head}: {', '.join(parts)}" if parts else f"{head}: nothing to simplify"
