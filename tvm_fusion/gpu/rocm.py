"""What building for ROCm (MI250X) needs, and a clear error when this TVM lacks it.

Building a ROCm kernel takes three things: TVM's AMDGPU code generator
(``target.build.rocm``, LLVM with the AMDGPU backend), a ROCm installation for the
device bitcode libraries and ``ld.lld`` that link the code object (``$ROCM_PATH``,
``hipcc`` on ``PATH`` or ``/opt/rocm``), and, to run it, TVM's ROCm runtime (a TVM
built with ``USE_ROCM=ON``: ``tvm.runtime.enabled("rocm")``). The pip TVM has the
first only: its LLVM has the AMDGPU backend, but there is no ROCm runtime and no ROCm
installation on this machine.
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

    @property
    def can_build(self) -> bool:
        """Code generator and ROCm installation: kernels can be compiled and exported."""
        return self.codegen and self.rocm_path is not None


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
    return RocmSupport(codegen=codegen, runtime=runtime, rocm_path=found)


def require_rocm_build(hw) -> None:
    """Raise :class:`TargetError` unless ``hw`` (a rocm target) can be built here.

    The message lists what was found and what is missing, and how to get it.
    """
    sup = rocm_support()
    if sup.can_build:
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

    missing = find_toolchain().missing
    have.append("gfx90a code-object linking (device bitcode, ld.lld 17+): "
                + ("present: `tvm-fusion plan MODEL --target mi250x` compiles every kernel "
                   "and reads its registers and LDS" if not missing
                   else f"MISSING ({APT_LINE})"))
    raise TargetError(
        f"cannot build for {hw.name} ({hw.tvm_config.get('kind')} "
        f"{hw.tvm_config.get('mcpu', '')}) with this TVM {tvm.__version__}:\n  "
        + "\n  ".join(have)
        + "\nexpected: a TVM built with ROCm (USE_ROCM=ON, USE_LLVM with the AMDGPU "
          "backend) on a machine with ROCm installed. Without them, `tvm-fusion plan "
          f"MODEL --target {hw.name}` plans the model and tvm_fusion.gpu.tir_check checks "
          "its scheduled kernels (threads, LDS, vector widths).")
