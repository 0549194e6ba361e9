"""CUDA building blocks: TVM's CUDA C for a kernel, nvcc, and ptxas' resource report.

``cuda_source`` generates CUDA C with TVM (``tvm.tirx.build`` for target ``cuda``);
``nvcc_compile`` compiles it with ``nvcc -cubin -arch=sm_XX -Xptxas -v`` and parses
ptxas' report: registers per thread, static shared memory per block, spill
stores/loads, stack frame, for each ``__global__`` entry. ``gpu/pipeline.py`` runs them
over a whole model.

Nothing here needs a GPU: only nvcc (``$TVM_FUSION_NVCC`` or ``nvcc`` on ``PATH``, else
``/usr/local/cuda/bin/nvcc``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from .. import config
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
        TIR (:func:`tvm_fusion.schedules.tir_check.device_kernels`).
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
    env = config.NVCC.get()
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


# ---- TVM: generate -------------------------------------------------------------------

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
