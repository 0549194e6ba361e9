"""TIR-level checks of scheduled GPU kernels, for targets whose code this TVM cannot build.

The pip TVM has no ROCm code generator, so MI250X kernels cannot be compiled here; what
can be checked is the lowered TIR, kernel by kernel, before anything would be built:

- threads per block (the product of the ``threadIdx`` extents of a launch) within the
  hardware's maximum (1024 on gfx90a) and a whole number of wavefronts (64 on CDNA2:
  a block of 32 threads leaves half of every wavefront idle; the rule is on the block
  total, since dlight's 8 x 16 matmul block is 128 threads = 2 full wavefronts);
- shared memory / LDS allocated per kernel (``shared`` and ``shared.dyn`` scopes)
  within the target's per-block limit (64 KB on MI250X);
- every vector access (a buffer store of a vector dtype) at most the target's vector
  width (128 bits: ``global_load_dwordx4`` / ``ds_read_b128``) with 1, 2, 3, 4, 8 or 16
  lanes.

The same walker works for CUDA targets (32-thread warps, 48 KB static shared memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm.tirx.build import split_host_device_mods

from ..errors import LoweringError, TvmFusionError
from ..family import strategy

_VECTOR_LANES = (1, 2, 3, 4, 8, 16)  # 3: dwordx3 / float3 accesses exist on both
_SHARED_SCOPES = ("shared", "shared.dyn")


@dataclass(frozen=True, kw_only=True)
class KernelLaunch:
    """One device kernel of a lowered PrimFunc, as its TIR says."""

    name: str
    threads: dict = field(default_factory=dict)  # threadIdx.x/y/z -> extent
    shared_bytes: int = 0  # static and dynamic together
    dynamic_shared_bytes: int = 0  # the ``shared.dyn`` part, sized at launch
    vector_bits: tuple[tuple[str, int, int], ...] = ()  # (buffer, lanes, bits) per vector store

    @property
    def threads_per_block(self) -> int:
        """Product of the threadIdx extents."""
        n = 1
        for v in self.threads.values():
            n *= v
        return n


def _children(stmt):
    """Direct sub-statements of a TIR statement, whatever its node type."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return list(stmt.seq)
    out = []
    for attr in ("body", "then_case", "else_case", "block", "init"):
        child = getattr(stmt, attr, None)
        if isinstance(child, tvm.tirx.Stmt):
            out.append(child)
    return out


def _walk(stmt, visit) -> None:
    stack = [stmt]
    while stack:
        node = stack.pop()
        visit(node)
        stack.extend(reversed(_children(node)))


def launch_of(func: tvm.tirx.PrimFunc, name: str) -> KernelLaunch:
    """The launch of one device kernel (or of a scheduled PrimFunc, from its bindings)."""
    threads: dict = {}
    shared = dynamic = 0
    vectors = []

    def visit(node):
        nonlocal shared, dynamic
        if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == "thread_extent":
            tag = node.node.thread_tag
            if tag.startswith("threadIdx"):
                threads[tag] = max(threads.get(tag, 1), int(node.value))
        elif isinstance(node, tvm.tirx.AllocBuffer):
            buf = node.buffer
            if buf.scope() in _SHARED_SCOPES:
                elems = 1
                for d in buf.shape:
                    elems *= int(d)
                dt = tvm.DataType(buf.dtype)
                nbytes = elems * dt.bits * dt.lanes // 8
                shared += nbytes
                dynamic += nbytes if buf.scope() == "shared.dyn" else 0
        elif isinstance(node, tvm.tirx.BufferStore):
            dt = tvm.DataType(str(node.value.ty))
            if dt.lanes > 1:
                vectors.append((node.buffer.name, int(dt.lanes), int(dt.bits * dt.lanes)))
        elif isinstance(node, tvm.tirx.For) and node.kind == tvm.tirx.ForKind.THREAD_BINDING:
            tag = node.thread_binding.thread_tag
            if tag.startswith("threadIdx"):
                threads[tag] = max(threads.get(tag, 1), int(node.extent))

    _walk(func.body, visit)
    return KernelLaunch(name=name, threads=threads, shared_bytes=shared,
                        dynamic_shared_bytes=dynamic, vector_bits=tuple(vectors))


def device_kernels(func: tvm.tirx.PrimFunc, target: tvm.target.Target,
                   name: str = "main") -> tuple[KernelLaunch, ...]:
    """Lower one scheduled PrimFunc with TVM's default TIR pipeline and describe its kernels.

    Lowering stops after the host/device split, before any code generator, so it works
    for targets this TVM cannot build (rocm without ROCm).

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A scheduled kernel (threads bound, e.g. by dlight or a tuning record).
    target : tvm.target.Target
    name : str
        Its global symbol.
    """
    mod = tvm.IRModule({name: func.with_attr("global_symbol", name)})
    host = "llvm" if tvm.runtime.enabled("llvm") else "c"
    mod = tvm.tirx.transform.BindTarget(target.with_host(host))(mod)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(target)
    with tvm.transform.PassContext(opt_level=3):
        _, device = split_host_device_mods(pipeline(mod))
    return tuple(launch_of(f, gv.name_hint) for dm in device.values()
                 for gv, f in sorted(dm.functions.items(), key=lambda kv: kv[0].name_hint)
                 if isinstance(f, tvm.tirx.PrimFunc))


def check_launch(k: KernelLaunch, hw, *, shared_limit: int | None = None) -> list[str]:
    """Violations of ``hw``'s limits by one kernel; [] when it is within them.

    Parameters
    ----------
    k : KernelLaunch
    hw : HardwareTarget
        A GPU target (``mi250x``, ``a100``...).
    shared_limit : int, optional
        Override of the per-block shared memory / LDS limit, static and dynamic alike.
        Default: the target's static limit (``usable_shared_memory_per_block``: 48 KB
        on NVIDIA, 64 KB LDS on MI250X) for static arrays, and the hardware's per-block
        maximum (``shared_memory_bytes_per_block``, reached through the dynamic opt-in
        TVM's CUDA runtime makes) for static plus dynamic.
    """
    fam = strategy(hw)
    label, wave = fam.shared_memory_name, fam.warp_name
    limit = hw.usable_shared_memory_per_block if shared_limit is None else shared_limit
    where = f"kernel {k.name} on {hw.name}"
    bad = []
    n = k.threads_per_block
    shape = " x ".join(f"{t}={v}" for t, v in sorted(k.threads.items())) or "no threadIdx"
    if n > hw.max_threads_per_block:
        bad.append(f"{where}: {n} threads per block ({shape}), limit {hw.max_threads_per_block}")
    if n % hw.warp_size:
        bad.append(f"{where}: {n} threads per block ({shape}) is not a multiple of the "
                   f"{hw.warp_size}-wide {wave}: {hw.warp_size - n % hw.warp_size} lanes of "
                   f"a {wave} idle; bind a multiple of {hw.warp_size} threads")
    static = k.shared_bytes - k.dynamic_shared_bytes
    if static > limit:
        bad.append(f"{where}: {static} bytes of static {label} per block, limit {limit} "
                   f"({limit // 1024} KB); use smaller staged tiles")
    dyn_limit = max(limit, hw.shared_memory_bytes_per_block) if shared_limit is None else limit
    if k.dynamic_shared_bytes and k.shared_bytes > dyn_limit:
        bad.append(f"{where}: {k.shared_bytes} bytes of {label} per block with "
                   f"{k.dynamic_shared_bytes} dynamic, limit {dyn_limit} "
                   f"({dyn_limit // 1024} KB); use smaller staged tiles or fewer stages")
    for buf, lanes, bits in k.vector_bits:
        if lanes not in _VECTOR_LANES or bits > hw.vector_width_bits:
            bad.append(f"{where}: a {lanes}-lane, {bits}-bit vector store to {buf}; the "
                       f"target allows {hw.vector_width_bits}-bit vectors of "
                       f"{'/'.join(map(str, _VECTOR_LANES))} lanes")
            break
    return bad


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text


def check_scheduled(mod: tvm.IRModule, hw, *, shared_limit: int | None = None
                    ) -> dict[str, list[str]]:
    """Check every scheduled PrimFunc of ``mod`` for ``hw``; name -> violations (all names).

    Parameters
    ----------
    mod : tvm.IRModule
        PrimFuncs already scheduled for ``hw``'s TVM target.
    hw : HardwareTarget
    shared_limit : int, optional
        See :func:`check_launch`.

    Raises
    ------
    LoweringError
        TVM's TIR pipeline fails on a kernel (``kernel`` names it).
    """
    if not strategy(hw).is_gpu:
        raise TvmFusionError(f"check_scheduled checks GPU kernels; {hw.name!r} is a CPU target")
    target = hw.tvm_target()
    out = {}
    for gv, func in sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if isinstance(func, tvm.tirx.PrimFunc):
            name = gv.name_hint
            try:
                launches = device_kernels(func, target, name)
            except (RuntimeError, ValueError) as e:  # TVM's own lowering of this kernel fails
                raise LoweringError(f"TVM cannot lower kernel {name} for {hw.name}: "
                                    f"{_last_line(str(e))}", kernel=name) from e
            out[name] = [v for k in launches
                         for v in check_launch(k, hw, shared_limit=shared_limit)]
    return out


def check_func(func: tvm.tirx.PrimFunc, name: str, target: tvm.target.Target, hw, *,
               shared_limit: int | None = None) -> list[str]:
    """Violations of one scheduled PrimFunc, lowered for ``target``; a schedule that
    does not lower is one too (with TVM's reason), not an exception: for choosing
    between schedules (:func:`check_scheduled` raises a LoweringError instead)."""
    try:
        kernels = device_kernels(func, target, name)
    except Exception as err:  # noqa: BLE001 - TVM's lowering raises InternalError & co
        last = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        return [f"kernel {name} on {hw.name}: its schedule does not lower ({last[:300]}); "
                "tune it or report the schedule that produced it"]
    return [v for k in kernels for v in check_launch(k, hw, shared_limit=shared_limit)]
