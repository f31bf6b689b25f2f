"""One set of paths for every command (issue 13): `peerd init` writes absolute paths, the
socket follows the state directory, `--state-dir`/``$PEERD_STATE_DIR`` mean the same node
everywhere, and `peerd status --state-dir` never shows another node; `status --watch`."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.cli.status import EXIT_NOT_RUNNING
from peerd.daemon.config import DEFAULT_SOCKET, DEFAULT_STATE_DIR, load_config
from peerd.store import lock as state_lock
from tests.daemon.helpers import running_server, sample_status

runner = CliRunner(env={"COLUMNS": "200"})


def make_fleet(tmp_path: Path) -> Path:
    fleet = tmp_path / "fleet"
    assert runner.invoke(app, ["fleet", "init", str(fleet)]).exit_code == 0
    return fleet


def test_init_writes_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The README's hand-made layout: before, state_dir = "h1/state" was resolved against the
    # config's folder (h1/h1/state), and the daemon's hint minted a second identity there.
    fleet = make_fleet(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init", "--fleet", str(fleet), "--state-dir", "./h1/state",
                                 "--out", "./h1/peerd.toml"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "h1/peerd.toml").read_text()
    assert f'state_dir = "{tmp_path / "h1/state"}"' in text
    cfg = load_config(tmp_path / "h1/peerd.toml")
    assert cfg.node.state_dir == tmp_path / "h1/state"
    # No --socket: commented out, and derived from the state directory.
    assert cfg.node.socket is None
    assert f'# socket = "{tmp_path / "h1/state/peerd.sock"}"' in text
    assert cfg.node.control_socket == tmp_path / "h1/state/peerd.sock"


def test_init_defaults_to_the_system_layout(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PEERD_STATE_DIR", raising=False)
    result = runner.invoke(app, ["init", "--fleet", str(make_fleet(tmp_path))])
    assert result.exit_code == 0, result.output
    printed = tmp_path / "printed.toml"
    printed.write_text(result.stdout)
    cfg = load_config(printed)
    assert (cfg.node.state_dir, cfg.node.control_socket) == (DEFAULT_STATE_DIR, DEFAULT_SOCKET)


def test_peerd_state_dir_is_the_same_override_for_init_and_keygen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = make_fleet(tmp_path)
    monkeypatch.setenv("PEERD_STATE_DIR", str(tmp_path / "env-state"))
    made = runner.invoke(app, ["keygen"])
    assert made.exit_code == 0, made.output
    assert (tmp_path / "env-state/node.key").is_file()
    assert f"wrote {tmp_path / 'env-state/node.key'}" in made.stderr  # says where
    assert made.stdout.strip().startswith("12D3KooW")  # stdout: the node id only
    result = runner.invoke(app, ["init", "--fleet", str(fleet)])
    printed = tmp_path / "printed.toml"
    printed.write_text(result.stdout)
    assert load_config(printed).node.state_dir == tmp_path / "env-state"


def test_status_state_dir_never_asks_another_nodes_socket(tmp_path: Path) -> None:
    # Another node's daemon answers on the socket its config names; the state directory
    # asked about is held by no daemon: offline (exit 3), not the other node's status.
    other = tmp_path / "other.sock"
    config = tmp_path / "other.toml"
    config.write_text(f'[fleet]\nadmin_public_key = "{"11" * 32}"\nfleet_id = "{"22" * 16}"\n'
                      f'[node]\nsocket = "{other}"\n')
    mine = tmp_path / "mine"
    mine.mkdir()
    with running_server(other):
        plain = runner.invoke(app, ["status", "--json", "--config", str(config)])
        result = runner.invoke(app, ["status", "--json", "--config", str(config),
                                     "--state-dir", str(mine)])
    assert plain.exit_code == 0  # the other node is there
    assert result.exit_code == EXIT_NOT_RUNNING, result.output
    offline = json.loads(result.stdout)
    assert offline["running"] is False
    assert offline["state_dir"] == str(mine)


def test_status_state_dir_asks_the_daemon_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "its.sock"
    with running_server(path), state_lock.acquire(tmp_path / "st", socket=path):
        result = runner.invoke(app, ["status", "--json", "--state-dir", str(tmp_path / "st")])
        peers = runner.invoke(app, ["peers", "--json", "--state-dir", str(tmp_path / "st")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["node"]["id"] == "12D3KooWself"
    assert peers.exit_code == 0, peers.output


def test_peers_state_dir_of_a_stopped_node_is_not_running(tmp_path: Path) -> None:
    result = runner.invoke(app, ["peers", "--state-dir", str(tmp_path)])
    assert result.exit_code == EXIT_NOT_RUNNING
    assert "no daemon holds" in result.stderr


def test_status_watch_without_a_terminal_prints_each_refresh_in_full(tmp_path: Path) -> None:
    # CliRunner's stdout is no terminal: no cursor movement, one whole status per refresh.
    rounds = itertools.count(1)
    path = tmp_path / "s.sock"
    with running_server(path, lambda: sample_status(next(rounds))):
        result = runner.invoke(app, ["status", "--watch", "--interval", "0.1", "--count", "3",
                                     "--socket", str(path)])
        as_json = runner.invoke(app, ["status", "--watch", "--json", "--interval", "0.1",
                                      "--count", "2", "--socket", str(path)])
    assert result.exit_code == 0, result.output
    assert "\x1b[" not in result.stdout  # no escape sequences in a pipe
    for n in (1, 2, 3):
        assert f"round {n} " in result.stdout
    assert result.stdout.index("round 1 ") < result.stdout.index("round 3 ")
    assert result.stdout.count("node 12D3KooWself") == 3
    lines = as_json.stdout.splitlines()
    assert [json.loads(line)["node"]["round"] for line in lines] == [4, 5]  # JSON Lines


def test_status_watch_goes_on_while_the_daemon_is_down(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "--watch", "--interval", "0.1", "--count", "2",
                                 "--socket", str(tmp_path / "absent.sock")])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("peerd is not running") == 2
