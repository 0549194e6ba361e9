"""AMDGPU building blocks: a gfx90a code object for a kernel, and what the backend allocated.

TVM's AMDGPU code generator (``target.build.rocm``, in the pip TVM) emits the code
object; linking it needs the ROCm device bitcode (ocml, oclc_*) and an ``ld.lld`` that
knows the code-object ABI TVM's LLVM emits. On Debian both are packages, and no ROCm
installation is needed::

    apt-get install rocm-device-libs lld-19

:func:`find_toolchain` finds them (``$ROCM_PATH``, ``/opt/rocm``, then Debian's paths);
:func:`amdgpu_compile` builds one scheduled PrimFunc inside :func:`toolchain`, which
points TVM's two ROCm callbacks at what was found, and reads each kernel's resources
back from the code object's metadata (``.vgpr_count``, ``.agpr_count``, ``.sgpr_count``,
``.group_segment_fixed_size``, ``.private_segment_fixed_size``, spill counts). No AMD
GPU is needed to build; running needs one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import tvm

from .. import config
from ..family import family_of
from .cuda import GpuToolchainError

DEBIAN_BITCODE = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
APT_LINE = "apt-get install rocm-device-libs lld-19"
MIN_LLD = 17  # ld.lld 14 rejects TVM's code objects: "unknown abi version"


@dataclass(frozen=True, kw_only=True)
class RocmToolchain:
    """What linking a gfx90a code object needs, as found here."""

    bitcode_dir: str | None
    lld: str | None

    @property
    def missing(self) -> list[str]:
        """What is not there, each with the package that provides it."""
        out = []
        if self.bitcode_dir is None:
            out.append("the ROCm device bitcode (ocml.bc, oclc_*.bc: Debian's "
                       "rocm-device-libs, or $ROCM_PATH/amdgcn/bitcode)")
        if self.lld is None:
            out.append(f"ld.lld {MIN_LLD} or newer (Debian's lld-19; ld.lld 14 fails with "
                       "'unknown abi version')")
        return out


@functools.lru_cache(maxsize=None)
def _lld_major(path: str) -> int:
    # one `ld.lld --version` per linker per process: an MI250X compile asks up to three
    # times (rocm_support, require_rocm_build, the link itself)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             check=False, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    m = re.search(r"LLD (\d+)", out)
    return int(m.group(1)) if m else 0


def find_toolchain() -> RocmToolchain:
    """The device bitcode folder and an ``ld.lld`` new enough, or None for each."""
    roots = [config.ROCM_PATH.get() or "", "/opt/rocm"]
    dirs = [Path(r) / "amdgcn" / "bitcode" for r in roots if r] + [DEBIAN_BITCODE]
    bitcode = next((str(d) for d in dirs if (d / "ocml.bc").is_file()), None)
    names = [f"ld.lld-{v}" for v in range(30, MIN_LLD - 1, -1)] + ["ld.lld"]
    cands = [shutil.which(n) for n in names]
    cands += [str(p) for v in range(30, MIN_LLD - 1, -1)
              if (p := Path(f"/usr/lib/llvm-{v}/bin/ld.lld")).is_file()]
    cands += [str(p) for r in roots if r and (p := Path(r) / "llvm/bin/ld.lld").is_file()]
    lld = next((c for c in dict.fromkeys(c for c in cands if c)
                if _lld_major(c) >= MIN_LLD), None)
    return RocmToolchain(bitcode_dir=bitcode, lld=lld)


@contextlib.contextmanager
def toolchain(found: RocmToolchain | None = None):
    """Point TVM's ROCm link and bitcode callbacks at ``found`` while building.

    TVM's own callbacks look for ``ld.lld-<its LLVM major>`` and ``$ROCM_PATH``; neither
    matches Debian's layout. The previous callbacks are restored on exit.

    Raises
    ------
    GpuToolchainError
        Something is missing: the message names it and the ``apt-get`` line.
    """
    import tvm_ffi
    from tvm.support import rocm as tvm_rocm

    found = found or find_toolchain()
    if found.missing:
        raise GpuToolchainError(
            "cannot link gfx90a code objects here: missing " + "; ".join(found.missing)
            + f". Install them with `{APT_LINE}` (Debian/Ubuntu, as root), or set "
            "ROCM_PATH to a ROCm installation")

    def link(obj):
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "kernel.o", Path(tmp) / "kernel.hsaco"
            src.write_bytes(bytes(obj))
            tvm_rocm.rocm_link(str(src), str(out), lld=found.lld)
            return bytearray(out.read_bytes())

    def bitcode():
        return tvm_rocm.callback_rocm_bitcode_path(found.bitcode_dir + "/")  # an FFI function: positional

    names = ("tvm_callback_rocm_link", "tvm_callback_rocm_bitcode_path")
    with _LOCK:  # re-entrant across threads: the outermost entry installs and restores
        if _DEPTH[0] == 0:
            _SAVED.update({n: tvm.get_global_func(n, allow_missing=True) for n in names})
            tvm_ffi.register_global_func(names[0], link, override=True)
            tvm_ffi.register_global_func(names[1], bitcode, override=True)
        _DEPTH[0] += 1
    try:
        yield found
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                for n, f in _SAVED.items():
                    if f is not None:
                        tvm_ffi.register_global_func(n, f, override=True)
                _SAVED.clear()


_LOCK = threading.Lock()
_DEPTH = [0]
_SAVED: dict = {}


@dataclass(frozen=True, kw_only=True)
class AmdgpuResources:
    """What the AMDGPU backend allocated for one kernel of a code object.

    Attributes
    ----------
    entry : str
        The kernel's symbol.
    vgprs, agprs, sgprs : int
        Vector registers per lane (on gfx90a the unified total, AGPRs included), the
        accumulation registers among them, scalar registers per wave.
    lds_bytes : int
        LDS (shared memory) per workgroup (``.group_segment_fixed_size``).
    scratch_bytes : int
        Private (spill) memory per lane (``.private_segment_fixed_size``).
    vgpr_spills, sgpr_spills : int
        Registers the backend spilled.
    max_workgroup_size, wavefront_size : int
    mfma : int
        Matrix-core instructions (``v_mfma_*``) in the kernel's code, as emitted
        (unrolled loops count each copy).
    """

    entry: str
    vgprs: int
    agprs: int
    sgprs: int
    lds_bytes: int
    scratch_bytes: int
    vgpr_spills: int
    sgpr_spills: int
    max_workgroup_size: int
    wavefront_size: int
    mfma: int = 0

    @property
    def unified_vgprs(self) -> int:
        """VGPRs a lane holds in gfx90a's unified file, AGPRs included. The code object's
        ``.vgpr_count`` already is that total (``.amdhsa_next_free_vgpr``: the AGPRs sit
        after ``.amdhsa_accum_offset``; PP-OCR rec's ``matmul2``: 448 = 256 + 192 AGPRs)."""
        return max(self.vgprs, self.agprs)

    @property
    def spills(self) -> bool:
        """Whether anything went to scratch."""
        return bool(self.scratch_bytes or self.vgpr_spills or self.sgpr_spills)


_KEYS = {".vgpr_count": "vgprs", ".agpr_count": "agprs", ".sgpr_count": "sgprs",
         ".group_segment_fixed_size": "lds_bytes",
         ".private_segment_fixed_size": "scratch_bytes", ".vgpr_spill_count": "vgpr_spills",
         ".sgpr_spill_count": "sgpr_spills", ".max_flat_workgroup_size": "max_workgroup_size",
         ".wavefront_size": "wavefront_size", ".name": "entry"}
_ITEM = re.compile(r"^(\s*)(- )?(\.[a-z_]+):\s*(\S*)")


def parse_amdgpu_metadata(asm: str) -> tuple[AmdgpuResources, ...]:
    """The ``amdhsa.kernels`` entries of a code object's assembly (its YAML metadata).

    Only each kernel's own keys count, not those of its ``.args`` (which have ``.name``
    too): they sit at the kernel entry's indentation.
    """
    body = asm.split("amdhsa.kernels:", 1)
    if len(body) < 2:
        return ()
    out, cur, indent = [], None, None
    for line in body[1].splitlines():
        if line.strip().startswith((".end_amdgpu_metadata", "amdhsa.target", "amdhsa.version")):
            break
        m = _ITEM.match(line)
        if not m:
            continue
        lead, dash, key, value = m.groups()
        col = len(lead) + (2 if dash else 0)
        if dash and (indent is None or col == indent):  # a new kernel
            if cur:
                out.append(cur)
            cur, indent = {}, col
        if cur is None or col != indent or key not in _KEYS:
            continue
        cur[_KEYS[key]] = value if key == ".name" else int(value or 0)
    if cur:
        out.append(cur)
    fields = {f: 0 for f in _KEYS.values() if f != "entry"}
    return tuple(AmdgpuResources(**{**fields, **k}) for k in out if "entry" in k)


def mfma_counts(asm: str) -> dict[str, int]:
    """``v_mfma_*`` instructions in each kernel's body of a code object's assembly
    (from its ``name:`` label to its ``.Lfunc_end``)."""
    counts, cur = {}, None
    for line in asm.splitlines():
        if cur is None:
            if line.endswith(":") and not line.startswith((".", " ", "\t")):
                cur = line[:-1]
                counts[cur] = 0
        elif line.startswith(".Lfunc_end"):
            cur = None
        elif "v_mfma" in line:
            counts[cur] += 1
    return counts


def code_object_resources(asm: str) -> tuple[AmdgpuResources, ...]:
    """Every kernel of a code object's assembly, with its matrix-core instructions."""
    counts = mfma_counts(asm)
    return tuple(dataclasses.replace(r, mfma=counts.get(r.entry, 0))
                 for r in parse_amdgpu_metadata(asm))


def amdgpu_compile(func: tvm.tirx.PrimFunc, target: tvm.target.Target, name: str,
                   found: RocmToolchain | None = None
                   ) -> tuple[tuple[AmdgpuResources, ...], str]:
    """Build one scheduled PrimFunc into a code object for ``target`` (gfx90a) and read
    its kernels' resources.

    Returns
    -------
    (tuple of AmdgpuResources, str)
        One record per kernel, and the code object's assembly.

    Raises
    ------
    GpuToolchainError
        The toolchain is missing, or TVM / ld.lld failed on the kernel (the message
        names the kernel).
    """
    mod = tvm.IRModule({name: func.with_attr("global_symbol", name)})
    with toolchain(found):
        try:
            lib = tvm.tirx.build(mod, target=target, pipeline=tir_pipeline(target))
        except Exception as err:  # noqa: BLE001  (TVM's and lld's errors, re-raised with the kernel)
            lines = str(err).strip().splitlines()
            raise GpuToolchainError(f"building {name} for {target.attrs.get('mcpu', 'rocm')} "
                                    f"failed: {lines[-1] if lines else type(err).__name__}"
                                    ) from err
    mods = [lib, *lib.imports]
    dev = next((m for m in mods if m.kind in ("hip", "rocm")), None)
    if dev is None:
        raise GpuToolchainError(f"TVM built {name} but produced no ROCm module (got "
                                f"{[m.kind for m in mods]})")
    asm = dev.inspect_source("asm")
    entries = code_object_resources(asm)
    if not entries:
        raise GpuToolchainError(f"the code object of {name} has no amdhsa.kernels metadata")
    return entries, asm


ROCM_PIPELINE = "tvm_fusion_rocm"
WARP_BUFFERS = 3  # the most a kernel of ours holds: MFMA's A, B and accumulator fragments


def _rocm_pipeline(**kwargs):
    """TVM's TIR pipeline, changed where it cannot lower MFMA fragments (TVM 0.27):

    - its ``LowerWarpMemory`` turns the first warp-scope buffer of a scope into
      registers and leaves the next ones, which the AMDGPU code generator then refuses
      ("Can only allocate shared or local memory inside kernel"): run once per buffer;
    - its common-subexpression pass, which runs first, hides ``threadIdx.x`` in a
      ``cse_v`` variable, where ``LowerWarpMemory`` needs its coefficient: off.
    """
    from tvm import tirx
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    pipeline, host, _ = default_s_tir_pipeline(**kwargs)

    @tvm.transform.module_pass(opt_level=0, name="tvm_fusion.RocmTIRPipeline")
    def without_cse(mod, ctx):
        config = {**dict(ctx.config), "tirx.disable_cse_tir": True}
        with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config,
                                       required_pass=list(ctx.required_pass),
                                       disabled_pass=list(ctx.disabled_pass)):
            return pipeline(mod)

    def device():
        return tvm.transform.Sequential(
            [tirx.transform.LowerWarpMemory()] * WARP_BUFFERS
            + [tirx.transform.StmtSimplify(), tirx.transform.LowerIntrin()])

    return without_cse, host, device


def tir_pipeline(target: tvm.target.Target) -> str:
    """The TIR pipeline a build for ``target`` uses: ours for ROCm, TVM's otherwise."""
    return ROCM_PIPELINE if family_of(target).own_tir_pipeline else "default"


def _register_pipeline() -> None:
    from tvm.tirx import compilation_pipeline

    compilation_pipeline.PIPELINE_MAP.setdefault(ROCM_PIPELINE, _rocm_pipeline)


_register_pipeline()


MAX_VGPRS = 512  # per lane on gfx90a, arch VGPRs and AGPRs together (AMD CDNA 2 ISA)


def amdgpu_violations(res: AmdgpuResources, hw) -> list[str]:
    """What makes a gfx90a kernel unfit to measure or deploy: more VGPRs than a lane
    holds, LDS over the target's per-block limit, or scratch (spilled registers); []
    when it fits. Each message names the kernel, its number and the limit."""
    where = f"kernel {res.entry} ({hw.tvm_config.get('mcpu', 'gfx90a')}) on {hw.name}"
    bad = []
    if res.unified_vgprs > MAX_VGPRS:
        bad.append(f"{where}: {res.unified_vgprs} VGPRs per lane (AGPRs included), limit "
                   f"{MAX_VGPRS}; use a smaller per-thread tile")
    if res.lds_bytes > hw.shared_memory_bytes_per_block:
        bad.append(f"{where}: {res.lds_bytes} B of LDS per workgroup, limit "
                   f"{hw.shared_memory_bytes_per_block}; use smaller LDS tiles")
    if res.spills:
        bad.append(f"{where}: spills to scratch ({res.scratch_bytes} B per lane, "
                   f"{res.vgpr_spills} VGPRs, {res.sgpr_spills} SGPRs); use a smaller "
                   f"per-thread tile")
    return bad
