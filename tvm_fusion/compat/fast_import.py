"""Import TVM's tensor intrinsics in about a second instead of half a minute.

MetaSchedule imports ``tvm.s_tir.tensor_intrin`` in every tuning process and in every
builder worker (its LocalBuilder restarts its worker pool for every batch). That module
parses ~250 TVMScript functions, and each parse calls ``inspect.stack()``, which reads
the source context of every frame: 24 s per import on this machine, paid once per batch.
The parser only needs the code context of the two frames nearest to the decorator, so
during that one import (:func:`light_parser_stack`) TVMScript's parser modules get a stack
with context for those frames alone.

Nothing changes when this module is imported. :func:`import_tensor_intrinsics` swaps the
``inspect`` name of TVMScript's parser modules (:data:`PARSER_MODULES`) for a copy whose
``stack`` is light, for the length of TVM's import only: ``inspect.stack`` itself, which
every other caller in the process (a debugger, pytest, another thread) uses, is never
replaced.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import linecache
import sys
import types

_CONTEXT_FRAMES = 4
VNNI_INTRIN = "tvmf_dot_16x4_vnni"
# TVM's modules that call ``inspect.stack()`` per parsed function (their ``inspect`` name
# is what :func:`light_parser_stack` swaps); one this TVM does not have is skipped
PARSER_MODULES = ("tvm.tirx.script.parser.entry", "tvm.script.parser.ir.entry",
                  "tvm.relax.script.parser.entry", "tvm.tirx.script.builder.ir")


def _light_stack(context: int = 1):
    frame = sys._getframe(1)
    records = []
    while frame is not None:
        if len(records) < _CONTEXT_FRAMES:
            # the lines straight from linecache: inspect.getframeinfo looks the file's
            # module up among all of sys.modules, 50 ms a call in a process that has
            # loaded ONNX, TVM and the package (38 s for the import, not 1)
            code = frame.f_code
            lines = linecache.getlines(code.co_filename, frame.f_globals)
            start = max(frame.f_lineno - 1 - context // 2, 0)
            start = max(min(start, len(lines) - context), 0)
            records.append(inspect.FrameInfo(
                frame, code.co_filename, frame.f_lineno, code.co_name,
                lines[start:start + context] or None, frame.f_lineno - 1 - start if lines else None))
        else:
            code = frame.f_code
            records.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno,
                                             code.co_name, None, None))
        frame = frame.f_back
    return records


class _LightInspect(types.ModuleType):
    """``inspect`` with :func:`_light_stack` for ``stack``: what a parser module sees
    inside :func:`light_parser_stack`."""

    stack = staticmethod(_light_stack)

    def __getattr__(self, name):
        return getattr(inspect, name)


_LIGHT_INSPECT = _LightInspect("inspect")


@contextlib.contextmanager
def light_parser_stack():
    """TVMScript parses inside this block with a stack that carries source context for its
    nearest frames only (about 1 s for TVM's intrinsics, not 24).

    Replaces the ``inspect`` global of :data:`PARSER_MODULES` and puts the original back on
    exit. The process's ``inspect.stack`` is untouched; the parser's closure-variable
    lookup reads frames, not their source lines, so it parses the same. Not re-entrant
    across threads: the outermost exit restores the modules for every thread.
    """
    swapped = []
    for name in PARSER_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # another TVM version: nothing of that name to speed up
            continue
        if getattr(mod, "inspect", None) is inspect:
            mod.inspect = _LIGHT_INSPECT
            swapped.append(mod)
    try:
        yield
    finally:
        for mod in swapped:
            mod.inspect = inspect


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` inside :func:`light_parser_stack`, and register
    ours (:mod:`tvm_fusion.schedules.vnni`); idempotent."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        register_vnni_intrin()
        return
    with light_parser_stack():
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics)
    register_vnni_intrin()  # ours, which tuned int8 records name


def build_kernel(mod, target, _params):
    """MetaSchedule builder function that skips the tensor-intrinsic import.

    Candidates reach the builder already scheduled (tensorization happened in the tuning
    process), so a builder worker never needs the intrinsic registry.
    """
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from .fast_math import vectorizable_exp

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    with vectorizable_exp():  # as compile builds it
        return tvm.tirx.build(mod, target=target)


def register_vnni_intrin() -> str:
    """Register :data:`VNNI_INTRIN` once (idempotent); returns its name.

    TVM 0.27's ``dot_16x4_vnni`` with the operands of ``llvm.x86.avx512.vpdpbusd.512`` as
    the wheel's LLVM declares them (``<64 x i8>``; see :mod:`tvm_fusion.schedules.vnni`). The
    description is TVM's ``dot_product_16x4_u8i8i32_desc``, restated here so that a
    process that only tensorizes with ours (the default int8 schedules, ``compile``) does
    not parse TVM's 249 intrinsics (17-38 s on this machine's loaded cores, not 0.1 s)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    try:
        TensorIntrin.get(VNNI_INTRIN)
        return VNNI_INTRIN
    except Exception:  # noqa: BLE001 - not registered yet
        pass

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "uint8", offset_factor=1),
             B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((4,), "uint8", offset_factor=1),
             B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            # the 4 bytes of A as one int32, inline: bound to a name, TVMScript makes
            # it a local buffer, which the lowering allocated per tile on the workspace
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"),
                                          16), dtype="int8x64"),
                B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16")

    TensorIntrin.register(VNNI_INTRIN, desc, impl)
    return VNNI_INTRIN

