"""A fleet of real ``Daemon`` objects in one process, for tests whose subject is not the
network (issue 25, item 8): what a mesh learns, what a cache keeps, what the audit records,
how a node comes back.

Each daemon runs its own round code (``Daemon._round``: the mode's step, versions, counters,
signing, the participation audit) and its own session handler (``Daemon._session``: the
gossip session, then persisting what arrived, auditing refusals, saving the ledger), so a
break in any of those fails these tests as it would fail a fleet of ``peerd run``
processes. Only the transport (an in-memory pipe instead of libp2p), discovery (every pair
meets each sweep) and the timers (the test's clock moves on one round interval a round) are
replaced; ``tests/integration`` keeps a real-daemon smoke per mode for those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import trio

from peerd.core.modes import ModeName
from peerd.daemon.config import Config
from peerd.daemon.daemon import Daemon
from peerd.net.stream import Stream
from tests.daemon.modefleet import Clock, mode_configs
from tests.net.test_gossip import pipe

#: A session over the pipe takes milliseconds; a hung one is a bug, not a slow machine.
SESSION_TIMEOUT_S = 60.0


def fleet_configs(root: Path, n: int, *, mode: ModeName = ModeName.WEIGHTS,
                  learning: dict[str, Any] | None = None, task: dict[str, Any] | None = None,
                  cordial: dict[str, Any] | None = None) -> list[Config]:
    """``n`` admitted members of one new fleet under ``root`` (node i bound to agent i and
    ``[task] node_index`` i), in ``mode`` with tests/daemon/modefleet.py's settings, then
    ``learning``, ``task`` and ``cordial`` (``[learning.cordial]``) over them."""
    out = []
    for cfg in mode_configs(root, mode, n):
        lc = cfg.learning
        out.append(dataclasses.replace(
            cfg, learning=dataclasses.replace(
                lc, **(learning or {}), cordial=dataclasses.replace(lc.cordial,
                                                                    **(cordial or {}))),
            task=dataclasses.replace(cfg.task, **(task or {}))))
    return out


def with_learning(cfg: Config, **learning: Any) -> Config:
    """``cfg`` with ``[learning]`` keys replaced (one member set apart from the others)."""
    return dataclasses.replace(cfg, learning=dataclasses.replace(cfg.learning, **learning))


class Fleet:
    """Daemons that share one clock; :meth:`cycle` is a round on each, then a sweep."""

    def __init__(self, cfgs: Iterable[Config], clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.daemons = [Daemon(c, clock=self.clock) for c in cfgs]

    def __getitem__(self, i: int) -> Daemon:
        return self.daemons[i]

    def round(self, daemons: Iterable[Daemon] | None = None) -> None:
        """One round on each daemon (all of them by default), then the clock moves on by the
        (shared) round interval, as the round loop sleeps."""
        for d in self.daemons if daemons is None else daemons:
            trio.run(d._round)
        self.clock.t += self.daemons[0].cfg.learning.round_interval_s

    def sweep(self, daemons: Iterable[Daemon] | None = None) -> None:
        """A session between every pair (of ``daemons``, default all), the lower index
        dialling."""
        ds = list(self.daemons if daemons is None else daemons)
        for i, a in enumerate(ds):
            for b in ds[i + 1:]:
                meet(a, b)

    def cycle(self, daemons: Iterable[Daemon] | None = None) -> None:
        ds = list(self.daemons if daemons is None else daemons)
        self.round(ds)
        self.sweep(ds)

    def restart(self, i: int) -> Daemon:
        """Daemon ``i`` stopped and started again on its state directory (a stopped daemon
        keeps nothing in memory: everything comes from disk)."""
        self.daemons[i] = Daemon(self.daemons[i].cfg, clock=self.clock)
        return self.daemons[i]


def meet(a: Daemon, b: Daemon) -> None:
    """One gossip session, ``a`` dialling ``b``: each side runs its daemon's session
    handler, as on a stream the transport accepted (the peer id is the one the handshake
    would have proved)."""

    async def main() -> None:
        io_a, io_b = pipe()
        with trio.fail_after(SESSION_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                # The handler reads and writes frames only: the pipe has what a Stream does.
                nursery.start_soon(a._session, cast(Stream, io_a), b.node.id, True)
                nursery.start_soon(b._session, cast(Stream, io_b), a.node.id, False)

    trio.run(main)
