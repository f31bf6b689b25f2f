"""`peerd keygen` and `peerd fleet ...` through typer's CliRunner."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.protocol.identity import node_id_of, public_key_from_node_id
from peerd.store.keyfile import read_private_key

runner = CliRunner()


def ok(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def fails(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0, result.output
    return result.output


def test_keygen_creates_0600_key_and_prints_its_node_id(tmp_path: Path) -> None:
    node_id = ok("keygen", "--state-dir", str(tmp_path)).strip()
    key_path = tmp_path / "node.key"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert node_id_of(read_private_key(key_path)) == node_id
    public_key_from_node_id(node_id)


def test_keygen_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    first = ok("keygen", "--state-dir", str(tmp_path)).strip()
    assert "--force" in fails("keygen", "--state-dir", str(tmp_path))
    assert node_id_of(read_private_key(tmp_path / "node.key")) == first
    second = ok("keygen", "--state-dir", str(tmp_path), "--force").strip()
    assert second != first
    assert node_id_of(read_private_key(tmp_path / "node.key")) == second


def test_keygen_uses_peerd_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEERD_STATE_DIR", str(tmp_path / "s"))
    node_id = ok("keygen").strip()
    assert node_id_of(read_private_key(tmp_path / "s" / "node.key")) == node_id


def make_fleet(tmp_path: Path) -> tuple[Path, str, str]:
    fleet = tmp_path / "fleet"
    ok("fleet", "init", str(fleet))
    a = ok("keygen", "--state-dir", str(tmp_path / "a")).strip()
    b = ok("keygen", "--state-dir", str(tmp_path / "b")).strip()
    ok("fleet", "admit", "--fleet", str(fleet), a)
    ok("fleet", "admit", "--fleet", str(fleet), b, "--expires", "2999-01-01")
    return fleet, a, b


def test_fleet_init_admit_revoke_show(tmp_path: Path) -> None:
    fleet, a, b = make_fleet(tmp_path)
    assert stat.S_IMODE((fleet / "admin.key").stat().st_mode) == 0o600
    ok("fleet", "revoke", "--fleet", str(fleet), a)
    data = json.loads(ok("fleet", "show", str(fleet / "manifest.peerd"), "--json"))
    assert data["seq"] == 4
    assert [m["node_id"] for m in data["members"]] == [b]
    assert data["members"][0]["not_after"].startswith("2999-01-01")
    assert data["revoked"] == [a]
    info = json.loads((fleet / "fleet.json").read_text())
    assert data["fleet_id"] == info["fleet_id"]
    text = ok("fleet", "show", str(fleet / "manifest.peerd"))
    assert "signature OK" in text
    assert b in text


def test_fleet_show_refuses_a_tampered_manifest(tmp_path: Path) -> None:
    fleet, _, b = make_fleet(tmp_path)
    path = fleet / "manifest.peerd"
    data = bytearray(path.read_bytes())
    at = data.index(b.encode()) + 20  # inside the signed body, not the signature
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    out = fails("fleet", "show", str(path))
    assert "invalid" in out
    assert "bad_signature" in out
    assert "tampered" in out
    assert fails("fleet", "admit", "--fleet", str(fleet), b)  # admin refuses to build on it


def test_fleet_show_with_another_admin_key(tmp_path: Path) -> None:
    fleet, _, _ = make_fleet(tmp_path)
    path = fleet / "manifest.peerd"
    alone = tmp_path / "copy.peerd"
    alone.write_bytes(path.read_bytes())
    fails("fleet", "show", str(alone))  # no fleet.json beside it: whom to trust?
    admin = json.loads((fleet / "fleet.json").read_text())["admin_public_key"]
    assert json.loads(ok("fleet", "show", str(alone), "--json", "--admin-key", admin))["seq"] == 3
    assert "bad_signature" in fails("fleet", "show", str(alone), "--admin-key", "00" * 32)


def test_fleet_admit_rejects_garbage_and_past_dates(tmp_path: Path) -> None:
    fleet, a, _ = make_fleet(tmp_path)
    assert "not a node id" in fails("fleet", "admit", "--fleet", str(fleet), "12D3KooWnope")
    assert "past" in fails("fleet", "admit", "--fleet", str(fleet), a, "--expires", "2001-01-01")
    ok("fleet", "revoke", "--fleet", str(fleet), a)
    assert "revoked" in fails("fleet", "admit", "--fleet", str(fleet), a)


def test_fleet_init_refuses_an_existing_fleet(tmp_path: Path) -> None:
    fleet, _, _ = make_fleet(tmp_path)
    before = (fleet / "admin.key").read_bytes()
    assert "already" in fails("fleet", "init", str(fleet))
    assert (fleet / "admin.key").read_bytes() == before
