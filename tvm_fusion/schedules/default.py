"""The schedule of a kernel without a tuning record, and records applied to a module.

A CPU kernel is built as it is (LLVM lowers the unscheduled loops), except an int8 GEMM,
which gets VNNI; a GPU kernel needs bound threads, which dlight's default rules give it. :func:`default_schedule` is that
choice, the one ``compile``, tune's verification and the offline bundle all use.
"""

from __future__ import annotations

import warnings

import tvm
from tvm import relax
from tvm.s_tir import dlight as dl

from tvm.target.codegen import target_has_features

from ..family import family_of
from ..compat.fast_import import import_tensor_intrinsics
from .int8_dw import has_int8_depthwise, schedule_int8_depthwise
from .vnni import (CONV_BLOCK, PACKED_BLOCK, lowering_error, schedule_conv_vnni,
                   schedule_packed_vnni)
from .dp4a import PackedInt8Dp4a
from .mfma import RocmMfmaMatmul
from .tir_check import check_func


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target, hw=None, *,
                     rules_used: dict | None = None) -> tvm.IRModule:
    """``mod`` with every unscheduled PrimFunc given what ``compile`` uses without a record.

    On an LLVM (CPU) target, :func:`default_cpu_schedule` (the kernel itself, but for
    int8 GEMMs on VNNI); on a GPU target, :func:`default_gpu_schedule` (within ``hw``'s
    limits, when given; ``rules_used`` as there).
    """
    if not family_of(target).dlight_default:
        return default_cpu_schedule(mod, target)
    return default_gpu_schedule(mod, target, hw, rules_used=rules_used)


def default_cpu_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` with its unscheduled packed int8 GEMMs and blocked int8 convs on VNNI where
    ``target`` has ``avx512_vnni`` (:func:`tvm_fusion.schedules.vnni.schedule_packed_vnni`,
    :func:`~tvm_fusion.schedules.vnni.schedule_conv_vnni`: unscheduled, such a kernel is a
    scalar loop ~250x slower), its blocked int8 depthwise convs with channels in vector
    lanes (:func:`tvm_fusion.schedules.int8_dw.schedule_int8_depthwise`); every other kernel
    as it is, which LLVM lowers as written. ``mod`` itself when nothing changed.

    A default schedule that does not go through TVM's lowering
    (:func:`~tvm_fusion.schedules.vnni.lowering_error`) is dropped: that kernel stays as it
    is, and a warning names it and TVM's reason, instead of the whole build failing."""
    vnni = target_has_features("avx512vnni", target)
    updated = {}
    dropped: dict[str, list[str]] = {}  # TVM's reason -> kernels
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc) or _is_scheduled(func):
            continue
        text = str(func)
        scheduled = None
        if vnni:
            scheduled = schedule_packed_vnni(func) if PACKED_BLOCK in text else \
                schedule_conv_vnni(func) if CONV_BLOCK in text else None
        if scheduled is None and has_int8_depthwise(text):  # any vector ISA: 16 lanes
            scheduled = schedule_int8_depthwise(func)
        if scheduled is None:
            continue
        why = lowering_error(scheduled)
        if why is not None:
            dropped.setdefault(why, []).append(gv.name_hint.removesuffix("_prepacked"))
            continue
        updated[gv] = scheduled
    for why, names in dropped.items():
        _warn_dropped(sorted(names), why)
    if not updated:
        return mod
    funcs = dict(mod.functions.items())
    funcs.update(updated)
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def _warn_dropped(names: list[str], why: str) -> None:
    """One warning for the kernels whose default schedule does not lower, the same text
    each time the same kernels are scheduled (compile schedules twice; Python shows a
    warning once per text and place)."""
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    warnings.warn(f"the default int8 schedule of kernel {names[0]}{more} does not lower "
                  f"({why}); such a kernel is scheduled as one without a default is (the "
                  "cost model's or the rules' pick, at worst its plain loops: correct, "
                  "slower). Please report it with the model", stacklevel=1)


def default_gpu_schedule(mod: tvm.IRModule, target: tvm.target.Target, hw=None, *,
                         rules_used: dict | None = None) -> tvm.IRModule:
    """Apply dlight's default GPU rules to every unscheduled PrimFunc of ``mod``.

    The rules are tried in dlight's order (Matmul, GEMV, Reduction, GeneralReduction,
    Fallback), the first that schedules a kernel wins. Unlike
    ``dlight.ApplyDefaultSchedule``, a rule that crashes on a fused kernel (the Matmul
    rule asserts on some fp16 conv epilogues it cannot inline) is skipped for that
    kernel and the next rule is tried, instead of failing the whole build. Given ``hw``
    (a HardwareTarget), a schedule that breaks its limits (dlight binds 3 x 16 threads
    to a 1 x 3 matmul output: a partial warp) or does not lower is passed over for the
    next rule's too; when every rule's is, the first one is kept and the caller's check
    names the kernel. ``rules_used``, when given, is filled with each scheduled
    PrimFunc's name -> the rule's class name (``Matmul``, ``Fallback`` ...).
    """
    if family_of(target).wmma_intrinsics:  # the Matmul rule's WMMA path needs the intrinsics
        import_tensor_intrinsics()
    # an integer GEMM on its packed weight: DP4A (schedules/dp4a.py); dlight has no rule for it
    # an fp16 GEMM on CDNA: matrix cores (schedules/mfma.py); dlight tensorizes for CUDA only
    rules = (PackedInt8Dp4a(), RocmMfmaMatmul(), dl.gpu.Matmul(), dl.gpu.GEMV(),
             dl.gpu.Reduction(),
             dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    updated = {}
    with target:
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc) or _is_scheduled(func):
                continue
            first = None  # (schedule, rule name)
            for rule in rules:
                try:
                    sch = rule.apply(func, target, False)
                except Exception:  # noqa: BLE001  (dlight rules assert: try the next)
                    continue
                if sch is None:
                    continue
                sch = sch[0] if isinstance(sch, (list, tuple)) else sch
                scheduled = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                first = first or (scheduled, type(rule).__name__)
                # dlight's Matmul rule leaves a padded reindex buffer undefined in some
                # fused transformer matmuls: such a schedule does not lower.
                if hw is None or not check_func(scheduled, gv.name_hint, target, hw):
                    updated[gv] = scheduled
                    if rules_used is not None:
                        rules_used[gv.name_hint] = type(rule).__name__
                    break
            if gv not in updated and first is not None:
                updated[gv] = first[0]
                if rules_used is not None:
                    rules_used[gv.name_hint] = first[1]
    if not updated:
        return mod
    funcs = dict(mod.functions.items())
    funcs.update(updated)
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


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
    with target, tvm.transform.PassContext(opt_level=3):
        if database is not None:
            with database:
                mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    origin = {gv.name_hint: "record" if _is_scheduled(f) else "dlight"
              for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    return default_gpu_schedule(mod, target), origin


