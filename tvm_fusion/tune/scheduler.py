"""A round-robin task scheduler that stops each task at its own allotment.

MetaSchedule's round-robin takes one ``max_trials_per_task`` for all tasks, and ending a
task from a measure callback can crash its scheduler (the task being joined is returned
as the next one after it was terminated). Here the stop decision is asked for in
``next_task_id``, after the task's batch is joined, where terminating is safe.
"""

from __future__ import annotations

from typing import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler


@derived_object
class BudgetedRoundRobin(PyTaskScheduler):
    """Round-robin over the tasks; ``done(task_id)`` says when one has had enough."""

    def __init__(self, done: Callable[[int], bool]):
        super().__init__()
        self.done = done
        self.cursor = -1

    def next_task_id(self) -> int:
        outer = self._outer()
        tasks = outer.tasks_
        n = len(tasks)
        for i in range(n):
            outer.touch_task(i)  # joins finished batches: our measure callbacks run here
        for _ in range(n):
            self.cursor = (self.cursor + 1) % n
            i = self.cursor
            if tasks[i].is_terminated:
                continue
            if tasks[i].runner_futures is not None:
                outer.join_running_task(i)
            if self.done(i):
                outer.terminate_task(i)
                continue
            return i
        return -1
