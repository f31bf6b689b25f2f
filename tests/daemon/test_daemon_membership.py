"""Membership told plainly (issue 13): a node that is not admitted says so, and what to do,
in its log and in `peerd status`, whether its own manifest or a peer refused it. A real
``Daemon`` object (not run: no sockets)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.daemon.daemon import Daemon
from peerd.daemon.notices import Membership
from tests.daemon.helpers import fleet_config, running_server

runner = CliRunner(env={"COLUMNS": "200"})


def _keygen(state: Path) -> str:
    out = runner.invoke(app, ["keygen", "--state-dir", str(state)])
    assert out.exit_code == 0, out.output
    match = re.search(r"12D3KooW\w+", out.stdout)
    assert match is not None
    return match.group(0)


def _daemon(tmp_path: Path, *, admitted: bool, with_manifest: bool = True) -> Daemon:
    fleet = tmp_path / "fleet"
    assert runner.invoke(app, ["fleet", "init", str(fleet)]).exit_code == 0
    state = tmp_path / "st"
    own, other = _keygen(state), _keygen(tmp_path / "other")
    for node_id in [other, own] if admitted else [other]:
        assert runner.invoke(app, ["fleet", "admit", "--fleet", str(fleet), node_id]).exit_code == 0
    return Daemon(fleet_config(tmp_path, fleet, state, with_manifest=with_manifest))


def test_a_node_its_manifest_does_not_list_says_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"):
        daemon = _daemon(tmp_path, admitted=False)
    fleet = daemon.cfg.fleet.fleet_id.hex()
    advice = (f"not admitted to fleet {fleet}: ask the admin to run "
              f"'peerd fleet admit {daemon.node.id}'")
    assert advice in caplog.text
    assert daemon.membership() == "not_member"
    status = daemon.status()
    assert status.node.membership == "not_member"
    path = tmp_path / "s.sock"
    with running_server(path, lambda: status):
        shown = runner.invoke(app, ["status", "--socket", str(path)])
    assert shown.exit_code == 0, shown.output
    assert f"not_member: {advice}" in shown.stdout


def test_a_member_shows_no_advice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        daemon = _daemon(tmp_path, admitted=True)
    assert daemon.membership() == "member"
    assert "fleet admit" not in caplog.text
    path = tmp_path / "s.sock"
    status = daemon.status()
    with running_server(path, lambda: status):
        shown = runner.invoke(app, ["status", "--socket", str(path)])
    assert "fleet admit" not in shown.stdout


def test_without_a_manifest_the_node_is_unknown(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, admitted=False, with_manifest=False)
    assert daemon.membership() == "unknown"  # the placeholder manifest judges nobody


def test_a_peers_refusal_tells_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    peer = "12D3KooWHrSJFRHKPKfFrEJFS3wxJZoR6V95nzTRkHsnQ1MxDjz4"
    told = Membership("ab" * 16, "12D3KooWself")
    assert told.verdict(own_refusal="not_member", signed=False) == "unknown"
    told.refused_as = "not_member"  # what the daemon records from a peer's Error
    verdict = told.verdict(own_refusal="not_member", signed=False)
    assert verdict == "not_member"
    with caplog.at_level("WARNING"):
        told.tell(verdict, peer)
        told.tell(verdict, peer)  # said once per change, not every gossip sweep
    assert caplog.text.count("ask the admin to run 'peerd fleet admit 12D3KooWself'") == 1
    assert f"(refused by …{peer[-6:]})" in caplog.text
    # A signed manifest that lists it wins over an old refusal only once a session is clean.
    told.refused_as = None
    assert told.verdict(own_refusal=None, signed=True) == "member"
    assert told.verdict(own_refusal="revoked", signed=True) == "revoked"
