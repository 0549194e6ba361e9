"""Import TVM's tensor intrinsics in about a second instead of half a minute.

MetaSchedule imports ``tvm.s_tir.tensor_intrin`` in every tuning process and in every
builder worker (its LocalBuilder restarts its worker pool for every batch). That module
parses ~250 TVMScript functions, and each parse calls ``inspect.stack()``, which reads
the source context of every frame: 24 s per import on this machine, paid once per batch.
The parser only needs the code context of the two frames nearest to the decorator, so
during that one import we hand it a stack with context for those frames alone.
"""

from __future__ import annotations

import inspect
import sys

_CONTEXT_FRAMES = 4


def _light_stack(context: int = 1):
    frame = sys._getframe(1)
    records = []
    while frame is not None:
        if len(records) < _CONTEXT_FRAMES:
            info = inspect.getframeinfo(frame, context)
            records.append(inspect.FrameInfo(frame, *info))
        else:
            code = frame.f_code
            records.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno,
                                             code.co_name, None, None))
        frame = frame.f_back
    return records


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` with the light stack, and register ours
    (:mod:`.vnni`), idempotent."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        from .vnni import register_vnni_intrin

        register_vnni_intrin()
        return
    saved = inspect.stack
    inspect.stack = _light_stack
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics)
    finally:
        inspect.stack = saved
    from .vnni import register_vnni_intrin  # ours, which tuned int8 records name

    register_vnni_intrin()


def build_kernel(mod, target, _params):
    """MetaSchedule builder function that skips the tensor-intrinsic import.

    Candidates reach the builder already scheduled (tensorization happened in the tuning
    process), so a builder worker never needs the intrinsic registry.
    """
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)
