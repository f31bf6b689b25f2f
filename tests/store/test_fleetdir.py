"""The fleet directory: created once, read with one set of limits, membership re-signed."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.identity import node_id_from_public_key, node_id_of, public_key_bytes
from peerd.protocol.manifest import decode_manifest_file, verify_manifest
from peerd.store import fleetdir
from peerd.store.fleetdir import (
    ADMIN_KEY_FILE,
    FLEET_FILE,
    MANIFEST_FILE,
    MAX_FLEET_FILE_LEN,
    FleetDirError,
    ManifestError,
)
from peerd.store.keyfile import NODE_KEY_FILE, read_private_key, write_private_key

#: An admission time for the fleet directory's record (its value is not what is tested here).
NOW = 1_800_000_000.0


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def key() -> bytes:
    return public_key_bytes(Ed25519PrivateKey.generate())


def test_create_writes_the_four_files_and_reads_back(tmp_path: Path) -> None:
    directory = tmp_path / "fleet"
    admin = fleetdir.create(directory)
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [ADMIN_KEY_FILE, FLEET_FILE, MANIFEST_FILE, fleetdir.ADMISSIONS_FILE])
    assert fleetdir.read_admissions(directory) == {}  # no members yet
    assert mode(directory) == 0o700
    assert mode(directory / ADMIN_KEY_FILE) == 0o600
    assert mode(directory / FLEET_FILE) == mode(directory / MANIFEST_FILE) == 0o644
    info = json.loads((directory / FLEET_FILE).read_text())
    assert info == {"fleet_id": admin.fleet.info.fleet_id.hex(),
                    "admin_public_key": public_key_bytes(admin.key).hex()}
    assert public_key_bytes(read_private_key(directory / ADMIN_KEY_FILE)) == \
        admin.fleet.info.admin_public_key
    opened = fleetdir.open_fleet(directory)
    assert opened == admin.fleet
    assert opened.manifest.seq == 1
    assert opened.manifest.members == ()
    assert opened.manifest_data == (directory / MANIFEST_FILE).read_bytes()


def test_create_refuses_an_existing_fleet_and_changes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "fleet"
    fleetdir.create(directory)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    with pytest.raises(FleetDirError, match="already holds a fleet"):
        fleetdir.create(directory)
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_create_with_members_signs_them_into_the_first_manifest(tmp_path: Path) -> None:
    keys = [key(), key()]
    admin = fleetdir.create(tmp_path, members=keys)
    m = fleetdir.open_fleet(tmp_path).manifest
    assert m.seq == 1
    assert sorted(x.public_key for x in m.members) == sorted(keys)
    assert m == admin.fleet.manifest


def test_admit_and_revoke_re_sign_with_the_next_seq(tmp_path: Path) -> None:
    fleetdir.create(tmp_path)
    a, b = key(), key()
    admin, _ = fleetdir.open_admin(tmp_path).admit(a, None, now=NOW)
    admin, _ = admin.admit(b, 4e9, now=NOW)
    assert admin.fleet.manifest.seq == 3
    on_disk = fleetdir.open_fleet(tmp_path)
    assert on_disk.manifest == admin.fleet.manifest
    assert on_disk.manifest_data == admin.fleet.manifest_data
    envelope = decode_manifest_file((tmp_path / MANIFEST_FILE).read_bytes())
    assert verify_manifest(envelope, public_key_bytes(admin.key),
                           admin.fleet.info.fleet_id).seq == 3  # signed by the admin key
    gone, _ = fleetdir.open_admin(tmp_path).revoke(node_id_from_public_key(a), now=NOW)
    assert gone.fleet.manifest.seq == 4
    assert fleetdir.open_fleet(tmp_path).manifest.revoked == {node_id_from_public_key(a)}
    with pytest.raises(ValueError, match="revoked"):
        gone.admit(a, None, now=NOW)
    assert fleetdir.open_fleet(tmp_path).manifest.seq == 4  # a refused change writes nothing


def test_missing_fleet_json_says_what_a_fleet_directory_is(tmp_path: Path) -> None:
    with pytest.raises(FleetDirError, match=r"no fleet.json in .*is it a fleet directory"):
        fleetdir.read_info(tmp_path)
    assert not fleetdir.has_info(tmp_path)


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "cannot read"),
    ('{"fleet_id": "00"}', "cannot read"),
    ('["a list"]', "cannot read"),
    ('{"fleet_id": "zz", "admin_public_key": "00"}', "cannot read"),
    ('{"fleet_id": "00", "admin_public_key": "00"}', "wrong length"),
    (" " * (MAX_FLEET_FILE_LEN + 1), "not a fleet file"),
])
def test_a_bad_fleet_json_is_refused_with_its_path(tmp_path: Path, text: str,
                                                    message: str) -> None:
    (tmp_path / FLEET_FILE).write_text(text)
    with pytest.raises(FleetDirError, match=message) as err:
        fleetdir.read_info(tmp_path)
    assert str(tmp_path / FLEET_FILE) in str(err.value)


def test_an_admin_key_that_is_not_the_fleets_is_refused(tmp_path: Path) -> None:
    fleetdir.create(tmp_path)
    write_private_key(tmp_path / ADMIN_KEY_FILE, Ed25519PrivateKey.generate(), overwrite=True)
    with pytest.raises(FleetDirError, match="does not match the admin key"):
        fleetdir.open_admin(tmp_path)
    (tmp_path / ADMIN_KEY_FILE).chmod(0o644)
    with pytest.raises(FleetDirError, match="0600"):
        fleetdir.open_admin(tmp_path)


def test_a_tampered_or_foreign_manifest_is_a_manifest_error(tmp_path: Path) -> None:
    fleetdir.create(tmp_path / "ours", members=[key()])
    fleetdir.create(tmp_path / "theirs")
    path = tmp_path / "ours" / MANIFEST_FILE
    member = node_id_from_public_key(fleetdir.open_fleet(tmp_path / "ours").manifest
                                     .members[0].public_key).encode()
    data = bytearray(path.read_bytes())
    data[data.index(member) + 20] ^= 0x01  # inside the signed body, not the signature
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError) as err:
        fleetdir.open_fleet(tmp_path / "ours")
    assert err.value.path == path
    assert err.value.code == "bad_signature"
    assert str(path) in str(err.value)
    with pytest.raises(ManifestError):
        fleetdir.open_admin(tmp_path / "ours")
    # Another fleet's manifest in our directory: verified against our fleet.json, refused.
    (tmp_path / "theirs" / MANIFEST_FILE).replace(path)
    with pytest.raises(ManifestError, match="invalid"):
        fleetdir.open_fleet(tmp_path / "ours")
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(ManifestError):
        fleetdir.read_manifest_envelope(path)
    with pytest.raises(FleetDirError, match="cannot read"):
        fleetdir.read_manifest_envelope(tmp_path / "missing.peerd")


def test_install_manifest_copies_the_verified_bytes(tmp_path: Path) -> None:
    fleet = fleetdir.create(tmp_path / "fleet", members=[key()]).fleet
    target = tmp_path / "etc" / MANIFEST_FILE
    target.parent.mkdir()
    fleetdir.install_manifest(fleet, target)
    assert target.read_bytes() == fleet.manifest_data
    assert mode(target) == 0o644
    fleetdir.install_manifest(fleet, fleet.manifest_path)  # its own file: nothing to do
    assert fleet.manifest_path.read_bytes() == fleet.manifest_data


def test_create_with_nodes_writes_each_node_key_and_admits_it(tmp_path: Path) -> None:
    dirs = [tmp_path / f"node{i}" for i in range(3)]
    fleet, ids = fleetdir.create_with_nodes(tmp_path / "fleet", dirs)
    assert ids == [node_id_of(read_private_key(d / NODE_KEY_FILE)) for d in dirs]
    assert sorted(m.node_id for m in fleet.manifest.members) == sorted(ids)
    # node i is cordial agent i (the demo's [task] node_index): its views speak for it
    assert [fleet.manifest.agent_of(i) for i in ids] == [0, 1, 2]
    assert fleetdir.open_fleet(tmp_path / "fleet") == fleet
    assert fleet.config_section() == {
        "admin_public_key": fleet.info.admin_public_key.hex(),
        "fleet_id": fleet.info.fleet_id.hex(),
        "manifest": str(tmp_path / "fleet" / MANIFEST_FILE)}
