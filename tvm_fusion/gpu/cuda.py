"""CUDA kernels of a fused model, compiled by nvcc here, with their resource use read back.

The flow for one target (``a100`` = sm_80, ``h100``/``h200`` = sm_90):

1. plan the model and apply the plan (one PrimFunc per fused group);
2. give every PrimFunc a GPU schedule: its best tuning record when a database is given,
   else dlight's default rules (Matmul, GEMV, Reduction, GeneralReduction, Fallback; the
   Matmul rule takes the tensor-core path for fp16 GEMMs on sm_70+);
3. generate CUDA C with TVM (``tvm.tirx.build`` for target ``cuda``);
4. compile the source with ``nvcc -cubin -arch=sm_XX -Xptxas -v`` and parse ptxas'
   report: registers per thread, static shared memory per block, spill stores/loads,
   stack frame, for each ``__global__`` entry;
5. check each entry against the target's limits (:mod:`tvm_fusion.gpu.limits`).

Nothing here needs a GPU: only nvcc (``$TVM_FUSION_NVCC`` or ``nvcc`` on ``PATH``, else
``/usr/local/cuda/bin/nvcc``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import tvm

from ..errors import TvmFusionError


class GpuToolchainError(TvmFusionError):
    """nvcc (or cuobjdump) is missing or failed on a generated kernel."""


@dataclass(frozen=True, kw_only=True)
class KernelResources:
    """What ptxas reports for one ``__global__`` entry, plus its launch bound.

    Attributes
    ----------
    entry : str
        The kernel's symbol (``<group>_kernel``, ``<group>_kernel_1`` ...).
    arch : str
        ``sm_80``, ``sm_90``...
    registers : int
        32-bit registers per thread.
    shared_bytes : int
        Static shared memory per block (``smem`` in ptxas' report).
    spill_stores, spill_loads, stack_bytes : int
        Bytes spilled to local memory, and the stack frame.
    threads_per_block : int
        ``__launch_bounds__`` of the entry in TVM's source (the block size it was
        scheduled for); 0 when the source has none.
    dynamic_shared_bytes : int
        Shared memory sized at launch (``extern __shared__``; TVM's tensor-core
        schedules stage through it). ptxas cannot see it: it comes from the lowered
        TIR (:func:`tvm_fusion.gpu.tir_check.device_kernels`).
    """

    entry: str
    arch: str
    registers: int
    shared_bytes: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    threads_per_block: int
    dynamic_shared_bytes: int = 0

    @property
    def total_shared_bytes(self) -> int:
        """Static plus dynamic shared memory per block."""
        return self.shared_bytes + self.dynamic_shared_bytes

    @property
    def registers_per_block(self) -> int:
        """Registers one block holds: per thread times threads, whole warps."""
        warps = -(-max(self.threads_per_block, 1) // 32)
        return self.registers * warps * 32


@dataclass(frozen=True, kw_only=True)
class CudaKernel:
    """One fused group built for CUDA: its source, its entries' resources, its schedule."""

    name: str
    schedule: str  # "record" (from a tuning database), "dlight", or what the caller passed
    source: str
    entries: tuple[KernelResources, ...]
    violations: tuple[str, ...] = field(default=())

    @property
    def registers(self) -> int:
        """The most registers per thread over the group's entries."""
        return max((e.registers for e in self.entries), default=0)

    @property
    def shared_bytes(self) -> int:
        """The most shared memory (static + dynamic) per block over the group's entries."""
        return max((e.total_shared_bytes for e in self.entries), default=0)


# ---- nvcc -------------------------------------------------------------------------

def find_nvcc() -> str | None:
    """Path of nvcc (``$TVM_FUSION_NVCC``, ``PATH``, ``/usr/local/cuda/bin``), or None."""
    env = os.environ.get("TVM_FUSION_NVCC")
    if env:
        return env if Path(env).is_file() else None
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def find_cuobjdump() -> str | None:
    """Path of cuobjdump: ``PATH``, beside nvcc, or the ``nvidia-cuda-cuobjdump`` wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = find_nvcc()
    if nvcc and (Path(nvcc).resolve().parent / "cuobjdump").is_file():
        return str(Path(nvcc).resolve().parent / "cuobjdump")
    try:  # pip install nvidia-cuda-cuobjdump puts it in nvidia/cu*/bin
        import nvidia  # type: ignore[import-not-found]
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for cand in sorted(Path(root).glob("cu*/bin/cuobjdump")):
            return str(cand)
    return None


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_BOUNDS = re.compile(r"__global__\s+void\s+__launch_bounds__\((\d+)\)\s+(\w+)\s*\(")


def parse_ptxas_report(text: str, source: str = "") -> tuple[KernelResources, ...]:
    """Parse ``ptxas -v`` output (as nvcc ``-Xptxas -v`` prints it) into one record per entry.

    Parameters
    ----------
    text : str
        nvcc's stderr.
    source : str
        The CUDA source, for each entry's ``__launch_bounds__``.
    """
    bounds = {m.group(2): int(m.group(1)) for m in _BOUNDS.finditer(source)}
    out, cur = [], None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = {"entry": m.group(1), "arch": m.group(2), "frame": (0, 0, 0)}
            continue
        if cur is None:
            continue
        m = _FRAME.search(line)
        if m:
            cur["frame"] = tuple(int(g) for g in m.groups())
            continue
        m = _USED.search(line)
        if m:
            stack, st, ld = cur["frame"]
            out.append(KernelResources(
                entry=cur["entry"], arch=cur["arch"], registers=int(m.group(1)),
                shared_bytes=int(m.group(2) or 0), spill_stores=st, spill_loads=ld,
                stack_bytes=stack, threads_per_block=bounds.get(cur["entry"], 0)))
            cur = None
    return tuple(out)


def nvcc_compile(source: str, arch: str, *, workdir: str | Path | None = None,
                 name: str = "kernel") -> tuple[tuple[KernelResources, ...], bytes]:
    """Compile CUDA ``source`` to a cubin for ``arch`` and read ptxas' resource report.

    Parameters
    ----------
    source : str
        A complete translation unit (TVM's generated source is one).
    arch : str
        ``sm_80``, ``sm_90``...
    workdir : path, optional
        Where to keep ``<name>.cu`` and ``<name>.cubin``; a temporary directory otherwise.
    name : str
        File stem.

    Returns
    -------
    (tuple of KernelResources, bytes)
        One record per ``__global__`` entry, and the cubin.

    Raises
    ------
    GpuToolchainError
        No nvcc, or nvcc rejected the source (its last error lines are in the message).
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise GpuToolchainError(
            "nvcc not found: expected $TVM_FUSION_NVCC, nvcc on PATH or "
            "/usr/local/cuda/bin/nvcc. Install the CUDA toolkit to compile and "
            "resource-check CUDA kernels.")
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(workdir) if workdir else Path(tmp)
        wd.mkdir(parents=True, exist_ok=True)
        cu, cubin = wd / f"{name}.cu", wd / f"{name}.cubin"
        cu.write_text(source)
        cmd = [nvcc, f"-arch={arch}", "-cubin", "-O3", "-Xptxas", "-v",
               "-diag-suppress", "177,550", "-o", str(cubin), str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-8:])
            raise GpuToolchainError(f"nvcc failed on {name} for {arch} (exit "
                                    f"{res.returncode}):\n{tail}")
        entries = parse_ptxas_report(res.stderr + res.stdout, source)
        if not entries and "__global__" in source:
            raise GpuToolchainError(f"nvcc compiled {name} for {arch} but printed no ptxas "
                                    f"resource report; got:\n{res.stderr[-600:]}")
        return entries, cubin.read_bytes()


def sass(cubin: bytes) -> str:
    """Disassemble a cubin with ``cuobjdump -sass``.

    Raises
    ------
    GpuToolchainError
        cuobjdump is not there (``pip install nvidia-cuda-cuobjdump
        nvidia-cuda-nvdisasm`` provides both it and the nvdisasm it runs).
    """
    tool = find_cuobjdump()
    if tool is None:
        raise GpuToolchainError("cuobjdump not found (expected on PATH, beside nvcc, or "
                                "from `pip install nvidia-cuda-cuobjdump`)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        env = dict(os.environ)  # cuobjdump runs nvdisasm, which sits beside it in the wheel
        env["PATH"] = f"{Path(tool).parent}{os.pathsep}{env.get('PATH', '')}"
        res = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                             check=False, env=env)
    if res.returncode != 0:
        raise GpuToolchainError(f"cuobjdump -sass failed: {res.stderr.strip()[-400:]}")
    return res.stdout


# ---- TVM: schedule and generate ------------------------------------------------------

def default_gpu_schedule(mod: tvm.IRModule, target: tvm.target.Target, hw=None
                         ) -> tvm.IRModule:
    """Apply dlight's default GPU rules to every unscheduled PrimFunc of ``mod``.

    The rules are tried in dlight's order (Matmul, GEMV, Reduction, GeneralReduction,
    Fallback), the first that schedules a kernel wins. Unlike
    ``dlight.ApplyDefaultSchedule``, a rule that crashes on a fused kernel (the Matmul
    rule asserts on some fp16 conv epilogues it cannot inline) is skipped for that
    kernel and the next rule is tried, instead of failing the whole build. Given ``hw``
    (a HardwareTarget), a schedule that breaks its limits (dlight binds 3 x 16 threads
    to a 1 x 3 matmul output: a partial warp) or does not lower is passed over for the
    next rule's too; when every rule's is, the first one is kept and the caller's check
    names the kernel.
    """
    from tvm.s_tir import dlight as dl

    if target.kind.name == "cuda":  # the Matmul rule's WMMA path needs the intrinsics
        from ..tune.fast_import import import_tensor_intrinsics

        import_tensor_intrinsics()
    from .tir_check import check_func

    rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
             dl.gpu.Fallback())
    updated = {}
    with target:
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc) or _is_scheduled(func):
                continue
            first = None
            for rule in rules:
                try:
                    sch = rule.apply(func, target, False)
                except Exception:  # noqa: BLE001  (dlight rules assert: try the next)
                    continue
                if sch is None:
                    continue
                sch = sch[0] if isinstance(sch, (list, tuple)) else sch
                scheduled = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                first = first or scheduled
                # dlight's Matmul rule leaves a padded reindex buffer undefined in some
                # fused transformer matmuls: such a schedule does not lower.
                if hw is None or not check_func(scheduled, gv.name_hint, target, hw):
                    updated[gv] = scheduled
                    break
            if gv not in updated and first is not None:
                updated[gv] = first
    if not updated:
        return mod
    funcs = dict(mod.functions.items())
    funcs.update(updated)
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def cuda_source(func: tvm.tirx.PrimFunc, target: tvm.target.Target, name: str) -> str:
    """CUDA C of one scheduled PrimFunc, as TVM generates it for ``target``."""
    func = func.with_attr("global_symbol", name)
    lib = tvm.tirx.build(tvm.IRModule({name: func}), target=target)
    mods = [lib, *lib.imports]
    for m in mods:
        if m.kind == "cuda":
            return m.inspect_source()
    raise GpuToolchainError(f"TVM built {name} for {target.kind.name} but produced no "
                            f"CUDA module (got {[m.kind for m in mods]})")


def _is_scheduled(func) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.is_scheduled", False))


def schedule_kernels(mod: tvm.IRModule, target: tvm.target.Target, *,
                     database=None) -> tuple[tvm.IRModule, dict[str, str]]:
    """Schedule every PrimFunc of a fused module for a GPU target.

    Parameters
    ----------
    mod : tvm.IRModule
        From :func:`tvm_fusion.apply_plan`.
    target : tvm.target.Target
    database : meta_schedule Database, optional
        Tuning records: a PrimFunc with a record takes it.

    Returns
    -------
    (tvm.IRModule, dict)
        The scheduled module and, per PrimFunc name, where its schedule came from
        (``record`` or ``dlight``).
    """
    from tvm import relax

    with target, tvm.transform.PassContext(opt_level=3):
        if database is not None:
            with database:
                mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    origin = {gv.name_hint: "record" if _is_scheduled(f) else "dlight"
              for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    return default_gpu_schedule(mod, target), origin


def build_cuda_kernels(model, target="a100", *, plan=None, database=None,
                       workdir: str | Path | None = None, check: bool = True
                       ) -> tuple[CudaKernel, ...]:
    """Plan, schedule, generate and nvcc-compile every kernel of ``model`` for a CUDA target.

    Parameters
    ----------
    model : ImportedModel
    target : str or HardwareTarget
        A ``cuda``-family target (``a100``, ``h100``, ``h200``).
    plan : FusionPlan, optional
        Default: a fresh cost plan for ``target``.
    database : meta_schedule Database, optional
        Tuning records to apply before the default schedules.
    workdir : path, optional
        Keep every ``.cu`` and ``.cubin`` there.
    check : bool
        Check every kernel against the target's limits, first in TIR (threads, shared
        memory, vector widths: a kernel failing those is not given to nvcc and has no
        entries), then from ptxas' report; violations are recorded on each
        :class:`CudaKernel` (use :func:`~tvm_fusion.gpu.limits.raise_on_violations`).

    Returns
    -------
    tuple of CudaKernel
        One per PrimFunc of the fused module, sorted by name.
    """
    from ..graph import build_graph
    from ..plan import apply_plan, make_plan
    from ..targets import as_target
    from .limits import GpuLimits, check_kernel
    from .tir_check import check_launch, device_kernels

    hw = as_target(target)
    if hw.family != "cuda":
        raise GpuToolchainError(f"build_cuda_kernels needs a cuda-family target, got "
                                f"{hw.name!r} ({hw.family}); CUDA targets: a100, h100, h200")
    tvm_target = hw.tvm_target()
    arch = str(tvm_target.attrs["arch"])
    graph = build_graph(model.mod)
    plan = plan or make_plan(graph, hw)
    mod, origin = schedule_kernels(apply_plan(graph, plan), tvm_target, database=database)
    limits = GpuLimits.from_target(hw)
    out = []
    for gv, func in sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        launches = device_kernels(func, tvm_target, name)
        tir_bad = tuple(v for k in launches for v in check_launch(k, hw))
        src = cuda_source(func, tvm_target, name)
        if tir_bad and check:  # e.g. > 48 KB static shared: nvcc would refuse it anyway
            out.append(CudaKernel(name=name, schedule=origin.get(name, "dlight"), source=src,
                                  entries=(), violations=tir_bad))
            continue
        entries, _ = nvcc_compile(src, arch, workdir=workdir, name=name)
        dyn = {k.name: k.dynamic_shared_bytes for k in launches}
        entries = tuple(replace(e, dynamic_shared_bytes=dyn.get(e.entry, 0)) for e in entries)
        bad = tuple(v for e in entries for v in check_kernel(e, limits)) if check else ()
        out.append(CudaKernel(name=name, schedule=origin.get(name, "dlight"), source=src,
                              entries=entries, violations=bad))
    return tuple(out)
