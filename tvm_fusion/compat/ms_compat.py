"""MetaSchedule behaviour we work around: its pandas task table inside Jupyter, and its
logger set-up crashing on a handler that has no name.

In a Jupyter kernel MetaSchedule's task scheduler renders its per-task table with pandas
after every batch (``s_tir.meta_schedule.using_ipython``). pandas is not a dependency of
TVM or of ours, so tuning from a notebook would crash there, and with pandas installed
the table would repeat itself under our own progress bar. MetaSchedule asks a global
function whether it runs in IPython; answering "no" keeps its plain-text log (which
goes to the log files under ``candidates/logs``).

TOPI's pooling blocks ask for MetaSchedule rules that TVM 0.27 does not register (a max
pool's block is annotated ``schedule_rule: meta_schedule.pool_max``, looked up as
``s_tir.meta_schedule.cpu.meta_schedule.pool_max``). ``ApplyCustomRule`` warned, and
PostOrderApply kept the annotated block out of every other rule, so a pool ran as plain
loops in every trial and in every no-record default.
"""

from __future__ import annotations

_done = False
_pools_done = False
POOL_RULES = ("pool_max", "pool_avg", "adaptive_pool_max", "adaptive_pool_avg")
TARGET_KEYS = ("cpu", "gpu", "cuda", "rocm")


def plain_task_tables() -> None:
    """Make MetaSchedule log its task table as text, also inside Jupyter (idempotent)."""
    global _done
    if _done:
        return
    import tvm_ffi

    tvm_ffi.register_global_func("s_tir.meta_schedule.using_ipython", lambda: False,
                                 override=True)
    _done = True


def drop_unnamed_handlers() -> None:
    """Detach handlers without a name from MetaSchedule's logger before it sets up its own.

    MetaSchedule rebuilds its loggers with ``logging.config.dictConfig`` from the names
    of the handlers already attached, and crashes (``'NoneType' object has no attribute
    'format'``) on one without a name, such as pytest's log capture or a handler a user
    added. dictConfig would replace them anyway; dropping them first avoids the crash.
    """
    import logging

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(logger.handlers):
        if handler.get_name() is None:
            logger.removeHandler(handler)


def _drop_request(sch, block):
    # Without the annotation the rules after ApplyCustomRule (inline, plain, tiling,
    # parallel-vectorize-unroll, thread binding) see the block like any reduction.
    sch.unannotate(block, "schedule_rule")
    return [sch]


def schedule_pools_like_reductions() -> None:
    """Register TOPI's pooling rule names so their blocks reach the space's rules (idempotent).

    ``ApplyCustomRule`` must come first in a space's rules (it does in every shipped
    space) for the later rules to see the unannotated block.
    """
    global _pools_done
    if _pools_done:
        return
    import tvm_ffi

    for key in TARGET_KEYS:
        for rule in POOL_RULES:
            tvm_ffi.register_global_func(f"s_tir.meta_schedule.{key}.meta_schedule.{rule}",
                                         _drop_request, override=True)
    _pools_done = True
