"""`peerd init`, `peerd status`, `peerd peers` against a real control server."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.cli.status import EXIT_NOT_RUNNING
from peerd.control.status import to_json
from peerd.daemon.config import load_config
from peerd.protocol.identity import node_id_of
from peerd.store.keyfile import NODE_KEY_FILE, read_private_key
from peerd.store.statedir import Counters, StateDir
from tests.daemon.helpers import (
    ADMIN_HEX,
    FLEET_HEX,
    fleet_config,
    running_server,
    sample_status,
)

# Wide enough that rich does not wrap the ids the assertions look for.
runner = CliRunner(env={"COLUMNS": "200"})


def test_status_json_is_exactly_the_daemon_dict(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    with running_server(path):
        result = runner.invoke(app, ["status", "--json", "--socket", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == to_json(sample_status())


@pytest.mark.parametrize("command", ["status", "peers"])
def test_an_answer_that_is_not_a_status_exits_1(tmp_path: Path, command: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither printed as JSON nor half-rendered: the operator learns the CLI cannot read it.
    import peerd.control.server as control_mod

    monkeypatch.setattr(control_mod, "to_json", lambda s: {"node": {}})
    monkeypatch.setattr(control_mod, "peers_to_json", lambda p: {"peers": [{"id": 1}]})
    path = tmp_path / "peerd.sock"
    with running_server(path):
        result = runner.invoke(app, [command, "--json", "--socket", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "cannot read" in result.stderr
    assert "missing" in result.stderr


def test_status_human_view(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    with running_server(path):
        result = runner.invoke(app, ["status", "--socket", str(path)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "12D3KooWself" in out
    assert "round 3" in out
    assert "version 7" in out
    assert "cache (1 entry)" in out
    assert "…3KooWpeer" not in out  # short ids kept whole
    assert "12D3KooWpeer" in out
    assert "bad_signature" in out
    assert "peers: 1 connected, 1 known" in out


def test_status_via_config_socket(tmp_path: Path) -> None:
    path = tmp_path / "d1.sock"
    config = tmp_path / "peerd.toml"
    config.write_text(f'[fleet]\nadmin_public_key = "{ADMIN_HEX}"\nfleet_id = "{FLEET_HEX}"\n'
                      f'[node]\nsocket = "d1.sock"\n')
    with running_server(path):
        result = runner.invoke(app, ["status", "--json", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["node"]["round"] == 3


def test_bad_config_is_reported(tmp_path: Path) -> None:
    config = tmp_path / "peerd.toml"
    config.write_text("[fleet]\n")
    result = runner.invoke(app, ["status", "--config", str(config)])
    assert result.exit_code == 1
    assert "[fleet] admin_public_key: required" in result.stderr


def test_peers_json_and_table(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    with running_server(path):
        as_json = runner.invoke(app, ["peers", "--json", "--socket", str(path)])
        table = runner.invoke(app, ["peers", "--socket", str(path)])
    assert as_json.exit_code == 0
    assert table.exit_code == 0
    assert json.loads(as_json.stdout) == {"peers": to_json(sample_status())["peers"]}
    assert "12D3KooWpeer" in table.stdout
    assert "/ip4/10.0.0.2/tcp/4011" in table.stdout
    assert "2 failed, retry in 37 s" in table.stdout  # the backoff
    assert "source" in table.stdout
    assert "mdns" in table.stdout


@pytest.mark.parametrize("command", ["status", "peers"])
def test_missing_socket_exits_non_zero(tmp_path: Path, command: str) -> None:
    result = runner.invoke(app, [command, "--socket", str(tmp_path / "none.sock")])
    assert result.exit_code == EXIT_NOT_RUNNING
    assert "peerd is not running? no socket at" in result.stderr
    assert result.stdout == ""


def test_a_file_that_is_not_a_socket_is_an_error_not_a_stopped_daemon(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    path.write_text("not a socket")
    result = runner.invoke(app, ["status", "--socket", str(path)])
    assert result.exit_code == 1  # not 3: nothing says a daemon ever ran there
    assert "is not a socket" in result.stderr


def test_status_offline_reads_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert runner.invoke(app, ["keygen", "--state-dir", str(state)]).exit_code == 0
    node_id = node_id_of(read_private_key(state / NODE_KEY_FILE))
    sd = StateDir(state)
    sd.save_counters(Counters(round=12, version=9))
    sd.write_blob("entry-12D3KooWpeer", b"frame")
    sd.write_blob("own.entry", b"model")
    sd.write_blob("entry-12D3KooWodd", b"frame")
    sd.write_blob("cache.index", json.dumps({"12D3KooWpeer": {
        "version": 4, "received_from": "12D3KooWrelay", "received_at": 1_800_000_000.0},
        # Unverified data on disk: a value of the wrong type is shown as unknown.
        "12D3KooWodd": {"version": "4", "received_from": 7, "received_at": True}}).encode())
    socket = str(tmp_path / "none.sock")
    human = runner.invoke(app, ["status", "--socket", socket, "--state-dir", str(state)])
    assert human.exit_code == EXIT_NOT_RUNNING
    assert "peerd is not running" in human.stdout
    assert "round 12" in human.stdout
    assert "version 9" in human.stdout
    assert node_id in human.stdout
    assert "12D3KooWpeer" in human.stdout
    assert "persisted cache (2 entries" in human.stdout
    as_json = runner.invoke(app, ["status", "--json", "--socket", socket,
                                  "--state-dir", str(state)])
    info = json.loads(as_json.stdout)
    assert info["running"] is False
    assert info["node"] == {"id": node_id, "round": 12, "version": 9, "counters_lost": False}
    size = (sd.blobs / "entry-12D3KooWpeer").stat().st_size
    assert sorted(info["cache"], key=lambda c: str(c["origin"])) == [
        {"origin": "12D3KooWodd", "version": None, "received_from": None,
         "received_at": None, "blob": "entry-12D3KooWodd", "bytes": size},
        {"origin": "12D3KooWpeer", "version": 4, "received_from": "12D3KooWrelay",
         "received_at": 1_800_000_000.0, "blob": "entry-12D3KooWpeer", "bytes": size}]


def test_status_offline_touches_nothing_a_running_daemon_may_be_using(tmp_path: Path) -> None:
    # A daemon may be up after all, e.g. on another socket: its in-flight temporary files,
    # a counter copy it is rewriting and its directory modes must be left exactly as they are.
    state = tmp_path / "state"
    assert runner.invoke(app, ["keygen", "--state-dir", str(state)]).exit_code == 0
    sd = StateDir(state)
    sd.save_counters(Counters(round=3, version=2))
    receiving = sd.blobs / ".tmp-recv-123-abc"
    receiving.write_bytes(b"half an entry")
    (state / "counters.b").write_bytes(b"torn")  # mid-rewrite, as the daemon sees it
    before = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
              for p in state.rglob("*")}
    result = runner.invoke(app, ["status", "--json", "--socket", str(tmp_path / "none.sock"),
                                 "--state-dir", str(state)])
    assert result.exit_code == EXIT_NOT_RUNNING
    assert json.loads(result.stdout)["node"]["round"] == 3
    after = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
             for p in state.rglob("*")}
    assert after == before  # nothing created, cleaned, tightened or quarantined


def test_status_offline_without_state(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "--socket", str(tmp_path / "s.sock"),
                                 "--state-dir", str(tmp_path / "nothing")])
    assert result.exit_code == EXIT_NOT_RUNNING
    assert "no state directory" in result.stderr
    assert not (tmp_path / "nothing").exists()  # a status query creates nothing


def make_fleet(tmp_path: Path) -> Path:
    fleet = tmp_path / "fleet"
    result = runner.invoke(app, ["fleet", "init", str(fleet)])
    assert result.exit_code == 0, result.output
    return fleet


def test_init_prints_a_config_that_loads(tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)
    info = json.loads((fleet / "fleet.json").read_text())
    result = runner.invoke(app, ["init", "--fleet", str(fleet), "--state-dir",
                                 str(tmp_path / "st")])
    assert result.exit_code == 0, result.output
    cfg_file = tmp_path / "printed.toml"
    cfg_file.write_text(result.stdout)
    cfg = load_config(cfg_file)
    assert cfg.fleet.admin_public_key.hex() == info["admin_public_key"]
    assert cfg.fleet.fleet_id.hex() == info["fleet_id"]
    assert cfg.fleet.manifest == (fleet / "manifest.peerd").resolve()
    assert cfg.node.state_dir == tmp_path / "st"
    assert "# capacity = 10" in result.stdout  # commented defaults


def test_run_with_a_missing_dataset_says_what_to_install_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import peerd.learn.data

    monkeypatch.setattr(peerd.learn.data, "FASHION_MNIST_DIR", tmp_path / "not-installed")
    fleet = make_fleet(tmp_path)
    state = tmp_path / "st"
    assert runner.invoke(app, ["keygen", "--state-dir", str(state)]).exit_code == 0
    cfg_file = tmp_path / "peerd.toml"
    result = runner.invoke(app, ["init", "--fleet", str(fleet), "--state-dir", str(state),
                                 "--out", str(cfg_file)])
    assert result.exit_code == 0, result.output
    text = cfg_file.read_text()
    assert '\n[task]\n# name = "digits"' in text
    cfg_file.write_text(text.replace('\n[task]\n', '\n[task]\nname = "fashion-mnist"\n'))
    result = runner.invoke(app, ["run", "--config", str(cfg_file)])
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)  # a message, not a crash
    assert str(tmp_path / "not-installed") in result.stderr
    assert "Traceback" not in result.output


def test_a_config_with_only_the_fleet_section_starts_and_waits_for_a_manifest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import dataclasses

    from peerd.daemon.daemon import Daemon
    from peerd.daemon.startup import DaemonError

    fleet = make_fleet(tmp_path)
    state = tmp_path / "st"
    assert runner.invoke(app, ["keygen", "--state-dir", str(state)]).exit_code == 0
    cfg = fleet_config(tmp_path, fleet, state)
    with caplog.at_level("WARNING"):
        daemon = Daemon(cfg)
    assert daemon.node.manifest.seq == 0
    assert daemon.node.manifest_envelope is None
    assert "learning it from the first peer" in caplog.text
    # A manifest that is configured but unusable is still a start-up error.
    (tmp_path / "bad.peerd").write_bytes(b"not a manifest")
    broken = dataclasses.replace(cfg, fleet=dataclasses.replace(
        cfg.fleet, manifest=tmp_path / "bad.peerd"))
    with pytest.raises(DaemonError, match="no valid fleet manifest in"):
        Daemon(broken)
    # One that cannot be read at all names the path and the cause.
    missing = dataclasses.replace(cfg, fleet=dataclasses.replace(
        cfg.fleet, manifest=tmp_path / "absent.peerd"))
    with pytest.raises(DaemonError, match=r"cannot read .*absent\.peerd: No such file"):
        Daemon(missing)


def test_init_out_copies_the_manifest(tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)
    out = tmp_path / "etc" / "peerd.toml"
    result = runner.invoke(app, ["init", "--fleet", str(fleet), "--out", str(out),
                                 "--socket", str(tmp_path / "p.sock")])
    assert result.exit_code == 0, result.output
    cfg = load_config(out)
    assert cfg.fleet.manifest == out.parent.resolve() / "manifest.peerd"
    assert (out.parent / "manifest.peerd").read_bytes() == \
        (fleet / "manifest.peerd").read_bytes()
    assert cfg.node.socket == tmp_path / "p.sock"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    again = runner.invoke(app, ["init", "--fleet", str(fleet), "--out", str(out)])
    assert again.exit_code == 1
    assert "--force" in again.stderr
    forced = runner.invoke(app, ["init", "--fleet", str(fleet), "--out", str(out), "--force"])
    assert forced.exit_code == 0


def test_init_rejects_a_tampered_manifest(tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)
    manifest = fleet / "manifest.peerd"
    data = bytearray(manifest.read_bytes())
    data[-3] ^= 0x01
    os.chmod(manifest, 0o644)
    manifest.write_bytes(bytes(data))
    out = tmp_path / "peerd.toml"
    result = runner.invoke(app, ["init", "--fleet", str(fleet), "--out", str(out)])
    assert result.exit_code == 1
    assert "does not verify" in result.stderr
    assert not out.exists()


def test_init_without_fleet_dir(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", "--fleet", str(tmp_path)])
    assert result.exit_code == 1
    assert "is it a fleet directory" in result.stderr
