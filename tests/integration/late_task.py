"""A task for `peerd run` whose model is built at once and whose data cannot be read: its
``prepare()`` (run after READY=1, peerd.daemon.launch) fails, as a dataset that turns out
corrupt would. ``[task] name = "tests.integration.late_task:task"``."""

from __future__ import annotations

from torch import nn

from peerd.core.local_update import LossName
from peerd.learn.data import DataError
from peerd.learn.tasks import TaskData

#: What prepare() raises; the daemon's one stderr line must carry it.
MESSAGE = "late_task data is unreadable"


class LateTask:
    name = "late_task"
    loss: LossName = "cross_entropy"

    def model(self) -> nn.Module:
        return nn.Linear(4, 2)

    def prepare(self) -> None:
        raise DataError(MESSAGE)

    def data(self) -> TaskData:
        self.prepare()
        raise AssertionError("prepare() raised")


def task() -> LateTask:
    return LateTask()
