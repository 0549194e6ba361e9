"""What building for ROCm (MI250X) needs, and a clear error when this TVM lacks it.

Building a ROCm kernel takes TVM's AMDGPU code generator (``target.build.rocm``, LLVM
with the AMDGPU backend) and the device bitcode libraries and an ``ld.lld`` that link
the code object: a ROCm installation (``$ROCM_PATH``, ``hipcc`` on ``PATH`` or
``/opt/rocm``) or Debian's ``rocm-device-libs`` and ``lld-19`` (``make rocm``;
:mod:`tvm_fusion.gpu.amdgpu`). Running it takes TVM's ROCm runtime (a TVM built with
``USE_ROCM=ON``: ``tvm.runtime.enabled("rocm")``) and an AMD GPU. The pip TVM has the
code generator, not the runtime: modules for MI250X build here and run there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tvm

from ..errors import TargetError


@dataclass(frozen=True, kw_only=True)
class RocmSupport:
    """Which of the three parts is present here."""

    codegen: bool
    runtime: bool
    rocm_path: str | None
    linker: bool = False  # device bitcode and ld.lld 17+ (Debian's packages will do)

    @property
    def can_build(self) -> bool:
        """Code generator and a ROCm installation or the device bitcode and ld.lld:
        kernels can be compiled into gfx90a code objects and exported."""
        return self.codegen and (self.rocm_path is not None or self.linker)


def rocm_support() -> RocmSupport:
    """Probe this TVM and this machine for ROCm."""
    codegen = tvm.get_global_func("target.build.rocm", allow_missing=True) is not None
    runtime = bool(tvm.runtime.enabled("rocm"))
    try:  # TVM's own lookup: $ROCM_PATH, hipcc on PATH, /opt/rocm/bin/hipcc
        from tvm.support.rocm import find_rocm_path

        found = find_rocm_path()
    except (ImportError, RuntimeError):
        found = None
    if found and not Path(found).is_dir():
        found = None
    from .amdgpu import find_toolchain  # a sibling building block

    return RocmSupport(codegen=codegen, runtime=runtime, rocm_path=found,
                       linker=not find_toolchain().missing)


def require_rocm_build(hw) -> None:
    """Raise :class:`TargetError` unless ``hw`` (a rocm target) can be built here.

    The message lists what was found and what is missing, and how to get it.
    """
    sup = rocm_support()
    if sup.can_build:  # Debian's bitcode and ld.lld: compile links in amdgpu.toolchain()
        return
    have = []
    have.append("AMDGPU code generator (target.build.rocm): "
                + ("present" if sup.codegen else "MISSING"))
    have.append("ROCm runtime (tvm.runtime.enabled('rocm')): "
                + ("present" if sup.runtime else "MISSING: this TVM was built without "
                   "USE_ROCM=ON"))
    have.append("ROCm installation ($ROCM_PATH, hipcc on PATH or /opt/rocm): "
                + (sup.rocm_path or "MISSING"))
    from .amdgpu import APT_LINE, find_toolchain  # a sibling building block

    have.append("gfx90a code-object linking (device bitcode, ld.lld 17+): "
                + "MISSING (" + "; ".join(find_toolchain().missing) + ")")
    raise TargetError(
        f"cannot build for {hw.name} ({hw.tvm_config.get('kind')} "
        f"{hw.tvm_config.get('mcpu', '')}) with this TVM {tvm.__version__}:\n  "
        + "\n  ".join(have)
        + f"\nfix: `{APT_LINE}` as root (or `make rocm`), or set ROCM_PATH to a ROCm "
          "installation; the pip TVM's AMDGPU code generator then builds the code objects "
          "(running them takes a TVM built with USE_ROCM=ON on an AMD GPU). Meanwhile "
          f"`tvm-fusion plan MODEL --target {hw.name}` plans the model and "
          "tvm_fusion.schedules.tir_check checks its scheduled kernels (threads, LDS, vector "
          "widths).")
