"""`peerd flags` / `peerd flags clear ORIGIN` (issue 12 item 13): through the daemon's control
socket, and on the persisted ledger while the daemon is down; and the daemon's side of it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import MappingProxyType

from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.cli.status import EXIT_ERROR, EXIT_NOT_RUNNING
from peerd.control.server import Operations, dispatch
from peerd.control.status import Status
from peerd.protocol.identity import node_id_of, private_key_from_seed
from peerd.protocol.ledger import Held, LedgerView
from peerd.store import ledgerfile
from peerd.store import lock as state_lock
from peerd.store.statedir import StateDir
from tests.daemon.helpers import fleet_config, running_server, sample_status

runner = CliRunner(env={"COLUMNS": "200"})
X = node_id_of(private_key_from_seed(b"\x05" * 32))
Y = node_id_of(private_key_from_seed(b"\x06" * 32))
DIGEST = "ab" * 32


class FakeDaemon:
    """What the daemon hands its control server: its status and the clear_flag action."""

    def __init__(self, *flagged: str) -> None:
        self.flagged = set(flagged)

    def status(self) -> Status:
        return dataclasses.replace(sample_status(), flagged=tuple(sorted(self.flagged)))

    def clear_flag(self, origin: str) -> bool:
        if origin not in self.flagged:
            return False
        self.flagged.discard(origin)
        return True

    def ops(self) -> Operations:
        return Operations(self.status, self.clear_flag)


def test_flags_are_listed_and_cleared_through_the_daemon(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    daemon = FakeDaemon(X, Y)
    with running_server(path, daemon.ops()):
        listed = runner.invoke(app, ["flags", "--json", "--socket", str(path)])
        human = runner.invoke(app, ["flags", "--socket", str(path)])
        cleared = runner.invoke(app, ["flags", "clear", X, "--socket", str(path)])
        again = runner.invoke(app, ["flags", "clear", X, "--socket", str(path)])
        after = runner.invoke(app, ["flags", "--json", "--socket", str(path)])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == {"running": True, "flagged": sorted([X, Y]),
                                         "cleared": None}
    assert human.exit_code == 0
    assert "flagged origins: 2" in human.stdout
    assert X in human.stdout
    assert cleared.exit_code == 0, cleared.output
    assert f"cleared the flag of {X}" in cleared.stdout
    assert again.exit_code == EXIT_ERROR
    assert f"{X} is not flagged" in again.stderr
    assert json.loads(after.stdout)["flagged"] == [Y]
    assert daemon.flagged == {Y}


def test_a_clear_flag_request_is_checked() -> None:
    daemon = FakeDaemon(X)
    bad = dispatch(b'{"api": 1, "method": "clear_flag", "origin": 7}', daemon.ops())
    assert bad["error"]["code"] == "bad_request"
    plain = dispatch(f'{{"api": 1, "method": "clear_flag", "origin": "{X}"}}'.encode(),
                     daemon.status)  # a provider without actions
    assert plain["error"]["code"] == "unknown_method"
    done = dispatch(f'{{"api": 1, "method": "clear_flag", "origin": "{X}"}}'.encode(),
                    daemon.ops())
    assert done["result"] == {"running": True, "flagged": [], "cleared": X}


def test_flags_offline_read_and_clear_the_persisted_ledger(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    ledgerfile.save(state, LedgerView(MappingProxyType({X: Held(3, DIGEST)}),
                                      frozenset({X, Y})))
    none = str(tmp_path / "none.sock")
    hint = runner.invoke(app, ["flags", "--socket", none])
    assert hint.exit_code == EXIT_NOT_RUNNING
    assert "--state-dir" in hint.stderr
    listed = runner.invoke(app, ["flags", "--json", "--socket", none,
                                 "--state-dir", str(state.path)])
    assert listed.exit_code == EXIT_NOT_RUNNING  # like `peerd status --state-dir`
    assert json.loads(listed.stdout) == {"running": False, "flagged": sorted([X, Y]),
                                         "cleared": None}
    cleared = runner.invoke(app, ["flags", "clear", X, "--socket", none,
                                  "--state-dir", str(state.path)])
    assert cleared.exit_code == 0, cleared.output
    assert "not running" in cleared.stdout
    missing = runner.invoke(app, ["flags", "clear", X, "--socket", none,
                                  "--state-dir", str(state.path)])
    assert missing.exit_code == EXIT_ERROR
    loaded = ledgerfile.load(state)
    assert loaded is not None
    assert loaded.flagged == frozenset({Y})
    assert loaded.held[X].version == 3
    assert [e["origin"] for e in state.read_audit() if e["event"] == "flag_cleared"] == [X]


def test_an_offline_clear_is_refused_while_a_daemon_holds_the_state_dir(
        tmp_path: Path) -> None:
    """A daemon whose socket is not where the command looked still holds the state
    directory's lock: the offline path refuses and leaves the ledger as it was."""
    state = StateDir(tmp_path / "state")
    ledgerfile.save(state, LedgerView(MappingProxyType({}), frozenset({X})))
    with state_lock.acquire(state.path, socket=tmp_path / "elsewhere.sock"):
        held = runner.invoke(app, ["flags", "clear", X, "--socket", str(tmp_path / "none"),
                                   "--state-dir", str(state.path)])
    assert held.exit_code == EXIT_ERROR
    assert "already running" in held.stderr
    assert "--socket" in held.stderr
    loaded = ledgerfile.load(state)
    assert loaded is not None
    assert loaded.flagged == frozenset({X})
    freed = runner.invoke(app, ["flags", "clear", X, "--socket", str(tmp_path / "none"),
                                "--state-dir", str(state.path)])
    assert freed.exit_code == 0, freed.output


def test_the_daemon_restores_its_flags_and_persists_a_clear(tmp_path: Path) -> None:
    from peerd.daemon.daemon import Daemon

    fleet = tmp_path / "fleet"
    assert runner.invoke(app, ["fleet", "init", str(fleet)]).exit_code == 0
    state = tmp_path / "st"
    assert runner.invoke(app, ["keygen", "--state-dir", str(state)]).exit_code == 0
    cfg = fleet_config(tmp_path, fleet, state)
    first = Daemon(cfg)
    first.node.ledger.flag(X)
    first.node.ledger.record(Y, 7, DIGEST, 1_800_000_000.0)
    assert first._ledger.save(first.node.ledger.view())
    second = Daemon(cfg)  # a restart
    assert second.node.ledger.flagged == {X}
    assert second.node.ledger.held[Y].version == 7
    assert second.status().flagged == (X,)
    assert second._clear_flag(X)
    assert not second._clear_flag(X)
    third = Daemon(cfg)
    assert third.node.ledger.flagged == set()
    assert third.node.ledger.held[Y].version == 7
