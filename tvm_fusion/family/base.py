"""What the code asks of a target's family, answered once per family.

A family (``cpu``, ``cuda``, ``rocm``) is what a hardware description's ``family`` field
names and what a TVM target's kind maps to. Each question below is one that the
planner, the cost model, the tuner or the build used to ask by comparing the family's
name; each family answers all of them in its own module (``cpu.py``, ``cuda.py``,
``rocm.py``), as TVM's ``relax/backend/<kind>/pipeline.py`` does for its pipelines.
"""

from __future__ import annotations

import dataclasses

# The answers of ``Family.resource_compiler`` and ``Family.occupancy_rules``.
PTXAS, CODE_OBJECT = "ptxas", "code-object"
CUDA_OCCUPANCY, CDNA_OCCUPANCY, PLAIN_OCCUPANCY = "cuda", "cdna", "plain"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    """One target family's answers. Every field is required: a new family answers all."""

    # -- names
    name: str
    """The family: ``family`` of a hardware description, ``search_spaces/<name>.json``."""
    tvm_kind: str
    """The TVM target kind its targets have (``llvm`` for CPUs)."""
    device_type: str
    """The runtime's device name its kernels run on (``tvm.device(device_type, 0)``)."""
    relax_backend: str
    """The ``tvm.relax.backend.<relax_backend>.pipeline`` module that lowers for it."""
    unit_name: str
    """What a compute unit is called in a target summary (``cores``, ``SM``, ``CU``)."""
    shared_memory_name: str
    """What a block's on-chip scratch is called in messages (``shared memory``, ``LDS``)."""
    shared_memory_short: str
    """Its short name in a summary table (``smem``, ``LDS``)."""
    warp_name: str
    """What a lockstep group of threads is called in messages (``warp``, ``wavefront``)."""

    # -- where the kernels run
    is_gpu: bool
    """A GPU: kernels are thread blocks with registers, shared memory and thread limits
    (the cost model's ``hw_gpu`` feature)."""
    host_cpu: bool
    """Kernels run on this machine's CPU: the reference build, the device a tuner
    needs here, and the machine ``calibrate`` measures are the host's."""
    checks_kernel_limits: bool
    """A kernel is checked against the target's threads, registers and shared memory
    before it is built, measured, imported or deployed (``schedules.tir_check``)."""

    # -- the analytical cost model (plan/)
    fork_join: bool
    """A kernel call is a Relax VM call plus a fork-join over the cores (priced from the
    call overhead, the tiles per core and the serial variant), which MetaSchedule's
    runner does not time; else it is a device launch of blocks (occupancy), timed."""
    core_caches: bool
    """A kernel keeps its working set in each core's caches (L2 per core, the shared
    last-level cache, the calibrated cache bandwidth), not in one block's shared memory."""
    vector_lanes: bool
    """A contraction's speed depends on how many SIMD vector lanes its innermost output
    dimension fills."""
    fitted_efficiency: bool
    """Compute is priced at the fitted share of peak per op kind (``cpu_efficiency``,
    fitted by ``calibrate`` from measured kernels of this family)."""
    prices_transcendentals: bool
    """Math calls (exp, erf, tanh) cost FLOPs beyond one each (no special-function units)."""
    planner_error: float
    """The analytical model's measured error factor on a kernel's time (median of
    max(measured / predicted, predicted / measured)); two merges that compete within it
    are a tie."""
    class_errors: tuple[tuple[str, float], ...]
    """The same error per op class (:data:`tvm_fusion.plan.cost.OP_CLASSES`), where it was
    measured; a class not here has ``planner_error``."""
    shared_compute_cancels: bool
    """The compute time both alternatives of a merge spend is left out of the tie margin
    (its error is the fitted efficiency, the same factor on both sides)."""
    occupancy_rules: str
    """Which vendor's rules give the blocks resident per unit: ``cuda`` (warp, register
    and shared-memory allocation units), ``cdna`` (wave64 SIMD VGPR rules) or ``plain``
    (plain division)."""
    mfma: bool
    """fp16 GEMMs may run on AMD matrix cores (MFMA) where the architecture has them."""
    reduction_max_threads: int
    """The most threads dlight's Reduction rule gives one row's reduction."""
    int8_conv_needs_blocking: bool
    """An int8 conv reaches the int8 unit only in the channel-blocked form (VNNI)."""
    blocked_layouts: bool
    """Activations may be planned in channel-blocked layouts (NCHW{c}c)."""
    reduced_precision: bool
    """``--precision fp16/bf16`` applies (tensor / matrix cores)."""

    # -- schedules and tuning
    dlight_default: bool
    """A kernel without a record gets dlight's default GPU schedule (and the planner
    respects what dlight can keep in one kernel); else the CPU rules' default schedule,
    which a record must beat and which a deploy may search for without a record."""
    shipped_space_default: bool
    """Tuning uses the shipped ``search_spaces/<name>.json`` unless told otherwise (else
    MetaSchedule's built-in space, with a kernel-limits check on GPUs)."""
    vector_fma_rules: bool
    """Its search spaces may use the vector-FMA rules (register tile, depthwise) and
    the CPU tensorize intrinsics its features allow (MetaSchedule's DefaultX86 way)."""
    vectorize_tensorize_init: bool
    """A tensorized block keeps its init loop vectorized (``RewriteTensorize``)."""
    weight_prepack: bool
    """Weights may be prepacked into the layout the schedule wants (and are by default)."""
    cost_models_by_isa: bool
    """A learned cost model of another target of this family with the same vector width
    serves when this target has none (the nearest ``mcpu``)."""
    wmma_intrinsics: bool
    """dlight's Matmul rule may tensorize (WMMA): its tensor intrinsics must be registered."""
    dp4a_int8: bool
    """Prepacked int8 GEMMs get the DP4A schedule (``schedules.dp4a``)."""
    host_calls: bool
    """The Relax VM may call host functions between kernels (NonZero, Unique); else a
    model that needs them cannot be compiled for it."""

    # -- toolchain
    resource_compiler: str
    """Which compiler reports a built kernel's registers and shared memory: ``ptxas``
    (nvcc), ``code-object`` (the AMDGPU code object) or ``""`` (none: not a GPU)."""
    device_toolchain: bool
    """Building links device code with a toolchain found here (device bitcode, ld.lld)."""
    own_tir_pipeline: bool
    """Kernels build through tvm-fusion's own TIR pipeline (``gpu.amdgpu``), not TVM's."""

    def error_of(self, op_class: str) -> float:
        """The model's measured error factor on a kernel of ``op_class``."""
        return dict(self.class_errors).get(op_class, self.planner_error)

    def int8_unit(self, peaks, features) -> tuple[str, str]:
        """``(peak_flops key, instruction)`` an int8 GEMM runs on, given the target's
        ``peak_flops`` and ``features``; key ``""`` when it has no int8 peak (priced at
        ``fp32_vector``)."""
        raise NotImplementedError(f"family {self.name!r} does not say where int8 GEMMs run")
