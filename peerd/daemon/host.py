"""What a round mode (``weights.py``, ``knowledge.py``) uses of the daemon.

:class:`peerd.daemon.daemon.Daemon` imports the modes, so they cannot import it back; each
declares the attributes it reads as a :class:`typing.Protocol` built on :class:`ModeHost`,
the part they share. Declarations only: nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import nn

from peerd.daemon.config import Config
from peerd.daemon.participation import Participation
from peerd.learn.tasks import Task
from peerd.node.state import NodeState
from peerd.store.statedir import StateDir


class ModeHost(Protocol):
    """The daemon as both round modes see it."""

    cfg: Config
    task: Task
    model: nn.Module
    node: NodeState
    metrics: Any  # peerd.daemon.daemon.Metrics (defined beside Daemon, which imports us)
    state: StateDir
    participation: Participation
    now: Callable[[], float]
