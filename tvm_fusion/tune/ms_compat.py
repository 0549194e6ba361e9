"""MetaSchedule behaviour we work around: its pandas task table inside Jupyter, and its
logger set-up crashing on a handler that has no name.

In a Jupyter kernel MetaSchedule's task scheduler renders its per-task table with pandas
after every batch (``s_tir.meta_schedule.using_ipython``). pandas is not a dependency of
TVM or of ours, so tuning from a notebook would crash there, and with pandas installed
the table would repeat itself under our own progress bar. MetaSchedule asks a global
function whether it runs in IPython; answering "no" keeps its plain-text log (which
goes to the log files under ``candidates/logs``).
"""

from __future__ import annotations

_done = False


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
