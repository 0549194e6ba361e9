"""MetaSchedule behaviour we turn off: its pandas task table inside Jupyter.

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
