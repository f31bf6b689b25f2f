"""`peerd fleet`: one way to name the fleet directory, idempotent changes, admission times."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.protocol.identity import node_id_of, public_key_bytes
from peerd.store import fleetdir

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def ok(*args: str) -> str:
    code, out = run(*args)
    assert code == 0, out
    return out


def new_id() -> str:
    return node_id_of(Ed25519PrivateKey.generate())


def seq(fleet: Path) -> int:
    return fleetdir.open_fleet(fleet).manifest.seq


def manifest_bytes(fleet: Path) -> bytes:
    return (fleet / fleetdir.MANIFEST_FILE).read_bytes()


def shown(*args: str) -> dict[str, object]:
    data = json.loads(ok("fleet", "show", "--json", *args))
    assert isinstance(data, dict)
    return data


def test_every_fleet_command_takes_fleet_dir(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    ok("fleet", "init", "--fleet", str(fleet))
    node = new_id()
    ok("fleet", "admit", "--fleet", str(fleet), node)
    by_option = shown("--fleet", str(fleet))
    assert shown(str(fleet)) == by_option  # `fleet show ./fleet` (the failure)
    assert shown(str(fleet / fleetdir.MANIFEST_FILE)) == by_option
    assert [m["node_id"] for m in by_option["members"]] == [node]  # type: ignore[attr-defined]
    ok("fleet", "revoke", "--fleet", str(fleet), node)
    assert shown("--fleet", str(fleet))["revoked"] == [node]


def test_fleet_directory_named_twice_or_not_at_all_is_refused(tmp_path: Path) -> None:
    code, out = run("fleet", "init")
    assert code == 1
    assert "--fleet DIR" in out
    code, out = run("fleet", "init", str(tmp_path / "a"), "--fleet", str(tmp_path / "b"))
    assert code == 1
    assert "twice" in out
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()
    code, out = run("fleet", "show")
    assert code == 1
    assert "--fleet DIR" in out


def test_admit_is_idempotent_and_says_what_changed(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    ok("fleet", "init", str(fleet))
    node = new_id()
    assert f"admitted {node}" in ok("fleet", "admit", "--fleet", str(fleet), node)
    assert seq(fleet) == 2
    before = manifest_bytes(fleet)
    out = ok("fleet", "admit", "--fleet", str(fleet), node)
    assert "nothing changed" in out
    assert seq(fleet) == 2
    assert manifest_bytes(fleet) == before  # not even re-signed
    out = ok("fleet", "admit", "--fleet", str(fleet), node, "--expires", "2999-01-01")
    assert f"renewed {node}: expires 2999-01-01T00:00:00+00:00 (was never)" in out
    assert seq(fleet) == 3
    assert "nothing changed" in ok("fleet", "admit", "--fleet", str(fleet), node,
                                   "--expires", "2999-01-01T00:00:00Z")
    assert seq(fleet) == 3


def test_revoke_is_idempotent_and_a_stranger_changes_nothing(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    ok("fleet", "init", str(fleet))
    member, stranger = new_id(), new_id()
    ok("fleet", "admit", "--fleet", str(fleet), member)
    before = manifest_bytes(fleet)
    out = ok("fleet", "revoke", "--fleet", str(fleet), stranger)
    assert f"{stranger}: not a member; nothing changed (manifest seq 2)" in out
    assert manifest_bytes(fleet) == before
    assert f"revoked {member} (manifest seq 3)" in ok("fleet", "revoke", "--fleet", str(fleet),
                                                      member)
    out = ok("fleet", "revoke", "--fleet", str(fleet), member)
    assert "already revoked; nothing changed (manifest seq 3)" in out
    assert seq(fleet) == 3


def test_show_lists_each_member_with_its_admission_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = tmp_path / "fleet"
    ok("fleet", "init", str(fleet))
    first, second = new_id(), new_id()
    clock = iter([1_800_000_000.0, 1_800_003_600.0, 1_800_007_200.0])
    monkeypatch.setattr("peerd.cli.fleet.time.time", lambda: next(clock))
    ok("fleet", "admit", "--fleet", str(fleet), first)
    ok("fleet", "admit", "--fleet", str(fleet), second, "--expires", "2999-01-01")
    ok("fleet", "admit", "--fleet", str(fleet), first, "--expires", "2998-01-01")  # renewal
    data = shown("--fleet", str(fleet))
    members = {m["node_id"]: m for m in data["members"]}  # type: ignore[attr-defined]

    def iso(stamp: float) -> str:
        return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")

    # A renewal keeps the first admission's time and seq.
    assert members[first]["admitted_at"] == iso(1_800_000_000.0)
    assert members[first]["admitted_seq"] == 2
    assert members[first]["not_after"] == "2998-01-01T00:00:00+00:00"
    assert members[second]["admitted_at"] == iso(1_800_003_600.0)
    assert members[second]["admitted_seq"] == 3
    text = ok("fleet", "show", "--fleet", str(fleet))
    assert f"{second}  admitted {iso(1_800_003_600.0)}  expires 2999-01-01" in text


def test_members_without_a_record_show_unknown_and_copies_never_borrow_times(
        tmp_path: Path) -> None:
    keys = [Ed25519PrivateKey.generate() for _ in range(2)]
    fleet = tmp_path / "fleet"
    fleetdir.create(fleet, members=[public_key_bytes(k) for k in keys], now=1_800_000_000.0)
    data = shown("--fleet", str(fleet))
    assert {m["admitted_at"] for m in data["members"]} == {  # type: ignore[attr-defined]
        "2027-01-15T08:00:00+00:00"}
    # A fleet made before the record existed: its members' times are unknown, not invented.
    (fleet / fleetdir.ADMISSIONS_FILE).unlink()
    assert {m["admitted_at"] for m in shown("--fleet", str(fleet))["members"]} == {  # type: ignore[attr-defined]
        None}
    assert "admitted unknown" in ok("fleet", "show", "--fleet", str(fleet))
    # A node's copy of the manifest, elsewhere: the fleet's record does not describe it.
    fleetdir.create(tmp_path / "other", members=[public_key_bytes(keys[0])])
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    (node_dir / "manifest.peerd").write_bytes(manifest_bytes(tmp_path / "other"))
    info = fleetdir.read_info(tmp_path / "other")
    data = shown(str(node_dir / "manifest.peerd"), "--admin-key", info.admin_public_key.hex())
    assert [m["admitted_at"] for m in data["members"]] == [None]  # type: ignore[attr-defined]


def test_a_corrupt_admission_record_is_reported_not_ignored(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    ok("fleet", "init", str(fleet))
    (fleet / fleetdir.ADMISSIONS_FILE).write_text("[1, 2")
    code, out = run("fleet", "show", "--fleet", str(fleet))
    assert code == 1
    assert fleetdir.ADMISSIONS_FILE in out
    assert "Traceback" not in out
    # A change still happens (the manifest is what counts) and says the record was not kept.
    node = new_id()
    code, out = run("fleet", "admit", "--fleet", str(fleet), node)
    assert code == 1
    assert "the manifest was changed (seq 2) but its admission record was not" in out
    assert fleetdir.open_fleet(fleet).manifest.member(node) is not None


def test_admit_binds_a_node_to_a_cordial_agent_and_show_says_so(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    ok("fleet", "init", str(fleet))
    a, b, c = new_id(), new_id(), new_id()
    out = ok("fleet", "admit", "--fleet", str(fleet), a, "--agent", "0")
    assert f"{a} speaks for cordial agent 0" in out
    ok("fleet", "admit", "--fleet", str(fleet), b)
    manifest = fleetdir.open_fleet(fleet).manifest
    assert (manifest.agent_of(a), manifest.agent_of(b)) == (0, None)
    # a second member for agent 0 is refused: one origin speaks for an agent
    code, out = run("fleet", "admit", "--fleet", str(fleet), c, "--agent", "0")
    assert code != 0
    assert "agent 0 is already bound to" in out
    # renewing without --agent keeps the binding; the same binding changes nothing
    before = seq(fleet)
    ok("fleet", "admit", "--fleet", str(fleet), a, "--expires", "2099-01-01")
    assert fleetdir.open_fleet(fleet).manifest.agent_of(a) == 0
    assert "nothing changed" in ok("fleet", "admit", "--fleet", str(fleet), a, "--agent", "0",
                                   "--expires", "2099-01-01")
    assert seq(fleet) == before + 1
    ok("fleet", "admit", "--fleet", str(fleet), b, "--agent", "1")  # binding a member: seq + 1
    assert seq(fleet) == before + 2
    text = ok("fleet", "show", "--fleet", str(fleet))
    lines = {n: next(line for line in text.splitlines() if n in line) for n in (a, b)}
    assert lines[a].endswith("agent 0")
    assert lines[b].endswith("agent 1")
    data = json.loads(ok("fleet", "show", "--json", "--fleet", str(fleet)))
    assert {m["node_id"]: m["agent"] for m in data["members"]} == {a: 0, b: 1}
    code, _ = run("fleet", "admit", "--fleet", str(fleet), c, "--agent", "-1")
    assert code != 0
