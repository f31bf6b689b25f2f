"""The contract every registered learning mode meets (issue 25, item 6), run over
``peerd.daemon.modes.MODES`` itself: a mode added to the registry is tested here without a
line more. Real ``Daemon`` objects in one process (no sockets); gossip through the real
session code over an in-memory pipe.

A mode must: start and say which it is (status and its ``--json``: mode, blend, local
policy; audit); run a round that publishes a signed own entry under the node's next version,
with the counters on disk and, where it has one, its learner file; reach a peer of its mode
through a session, and be reached; come back after a restart at the round and version it
had, holding its peer's entry again; and refuse what a node of another mode publishes
(another schema or kind), holding none of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from peerd.control.status import to_json
from peerd.core.modes import ModeName
from peerd.daemon.config_learning import what_runs
from peerd.daemon.daemon import Daemon
from peerd.daemon.modes import MODES
from peerd.net.gossip import SessionContext
from peerd.store.learnerfile import LEARNER_BLOB
from tests.daemon.modefleet import SETTINGS, Clock, mode_configs, with_mode
from tests.net.test_gossip import session

ALL = sorted(MODES)
#: Modes with a status block of their own (the views they hold).
WITH_BLOCK = {ModeName.CORDIAL, ModeName.SENSORS}


def test_every_registered_mode_is_covered_here() -> None:
    assert set(SETTINGS) == set(MODES) == set(ModeName)


def _fleet(tmp_path: Path, mode: ModeName, clock: Clock) -> list[Daemon]:
    return [Daemon(c, clock=clock) for c in mode_configs(tmp_path, mode)]


def _gossip(daemons: list[Daemon], clock: Clock) -> None:
    ctx = SessionContext(admin_key=daemons[0].cfg.fleet.admin_public_key, now=clock)
    session(daemons[0].node, daemons[1].node, a_ctx=ctx, b_ctx=ctx)


@pytest.mark.parametrize("mode", ALL)
def test_a_mode_starts_rounds_publishes_gossips_and_restores(tmp_path: Path,
                                                             mode: ModeName) -> None:
    clock = Clock()
    a, b = _fleet(tmp_path, mode, clock)
    assert a.mode.name is mode
    assert a.node is a.mode.node  # the node state the daemon gossips is the mode's
    assert (a.mode.status_block(clock()) is not None) == (mode in WITH_BLOCK)

    for _ in range(2):
        for d in (a, b):
            trio.run(d._round)
        _gossip([a, b], clock)
        clock.t += 10.0
    for d, peer in ((a, b), (b, a)):
        own = d.node.own
        assert own is not None
        assert own.entry.meta.origin == d.node.id
        assert d.metrics.round == d.node.round == 2
        assert d.metrics.version == own.entry.meta.version
        counters = d.state.load_counters()
        assert (counters.round, counters.version) == (2, d.metrics.version)
        assert d.state.blob_path(LEARNER_BLOB).exists() == (d.mode.learner is not None)
        assert peer.node.id in {i.meta.origin for i in d.node.cache}, mode
        records = d.participation.answer(None)["records"]
        assert [r["mode"] for r in records] == [str(mode)] * 2
        status = d.status()
        assert status.node.round == 2
        assert (status.views is not None) == (mode in WITH_BLOCK)
        # The status says what runs, in `peerd status --json` too, and guesses nothing.
        runs = what_runs(d.cfg.learning)
        assert (status.config.mode, status.config.blend, status.config.local_policy) == (
            str(runs[0]), runs[1], runs[2])
        shown = to_json(status)["config"]
        assert (shown["mode"], shown["blend"], shown["local_policy"]) == (
            str(mode), runs[1], runs[2])

    version = a.metrics.version
    a._persist()  # what the end of a daemon's session runs (the pipe here bypasses it)
    restarted = Daemon(a.cfg, clock=clock)
    assert restarted.mode.name is mode
    assert (restarted.node.round, restarted.metrics.version) == (2, version)
    # What it held comes back from its state directory: its peer's entry, still its mode's.
    assert b.node.id in {i.meta.origin for i in restarted.node.cache}, mode
    assert restarted.status().config.mode == str(mode)
    trio.run(restarted._round)
    assert restarted.metrics.round == 3
    assert restarted.metrics.version > version  # never a version twice


@pytest.mark.parametrize("mode", ALL)
def test_a_mode_refuses_what_another_mode_publishes(tmp_path: Path, mode: ModeName) -> None:
    other = ALL[(ALL.index(mode) + 1) % len(ALL)]
    clock = Clock()
    cfgs = mode_configs(tmp_path, mode)
    ours = Daemon(cfgs[0], clock=clock)
    theirs = Daemon(with_mode(cfgs[1], other), clock=clock)
    assert theirs.mode.name is other
    for d in (ours, theirs):
        trio.run(d._round)
    _gossip([ours, theirs], clock)
    # Refused when it arrived, or never asked for (a typed node's Want leaves out entries
    # of a kind it cannot hold): either way nothing of it is held or blended.
    assert theirs.node.id not in {i.meta.origin for i in ours.node.cache}
    assert ours.node.accepted == 0, (mode, other)
    trio.run(ours._round)
    assert theirs.node.id not in {i.meta.origin for i in ours.node.cache}
