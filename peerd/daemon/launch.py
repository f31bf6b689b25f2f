"""Start-up work of `peerd run` that finishes after READY=1: reading the task's data.

READY=1 promises the control socket, the listening host and the manifest
(docs/operations.md); the data is read in a worker thread after it, while mDNS probes and
peers connect, and the first round waits for it. A failure here is still a start-up failure
(:class:`~peerd.daemon.startup.LateStartupError`: one line, exit status 2). It owns only that
wait and that translation: what the data is and how it is read is the task's
(:class:`peerd.learn.tasks.Preparable`).
"""

from __future__ import annotations

import logging

import trio

from peerd.daemon.startup import LateStartupError
from peerd.learn.tasks import Preparable, Task

log = logging.getLogger("peerd.daemon.daemon")


async def load_data(task: Task) -> None:
    """``task.prepare()`` in a worker thread (abandoned if the node stops meanwhile); a task
    without it has nothing to read ahead."""
    if not isinstance(task, Preparable):
        return
    try:
        # The trio-typing stubs that py-libp2p pulls in predate abandon_on_cancel.
        await trio.to_thread.run_sync(task.prepare,  # type: ignore[call-arg]
                                      abandon_on_cancel=True)
    except Exception as exc:  # whatever a task raises, the node stops with one line
        log.debug("loading the data of task %s failed", task.name, exc_info=True)
        raise LateStartupError(f"task {task.name}: cannot load its data: "
                               f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
