"""Node ids and key files: canonical ids, 0600 from birth, atomic, never clobbered."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import (
    b58decode,
    b58encode,
    node_id_from_public_key,
    node_id_of,
    public_key_bytes,
    public_key_from_node_id,
    verify_signature,
)
from peerd.store.keyfile import KeyFileError, read_private_key, write_private_key
from peerd.store.statefile import atomic_write_raw


def test_node_ids_round_trip_and_look_like_libp2p() -> None:
    for i in range(20):
        pub = public_key_bytes(
            Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"%d" % i).digest())
        )
        node_id = node_id_from_public_key(pub)
        assert node_id.startswith("12D3KooW")
        assert len(node_id) == 52
        assert public_key_from_node_id(node_id) == pub


def test_base58_leading_zeros() -> None:
    for data in [b"", b"\x00", b"\x00\x00\x01", b"\xff" * 5]:
        assert b58decode(b58encode(data)) == data
    assert b58encode(b"\x00\x00\x01") == "112"


@pytest.mark.parametrize(
    "bad", ["", "12D3KooW0OIl", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "x" * 65]
)
def test_non_ed25519_or_garbage_ids(bad: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        public_key_from_node_id(bad)
    assert exc.value.reason is Reason.MALFORMED


def test_non_canonical_spelling_of_a_valid_id() -> None:
    node_id = node_id_of(Ed25519PrivateKey.generate())
    with pytest.raises(ProtocolError):
        public_key_from_node_id("1" + node_id)  # same number, one more leading zero byte


def test_wrong_public_key_length() -> None:
    with pytest.raises(ValueError, match="must be 32 bytes, got 31"):
        node_id_from_public_key(b"\x01" * 31)


def test_invalid_curve_point_is_a_bad_signature_not_a_crash() -> None:
    with pytest.raises(ProtocolError) as exc:
        verify_signature(b"\xff" * 32, b"\x00" * 64, b"msg")
    assert exc.value.reason is Reason.BAD_SIGNATURE


def test_key_file_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        key = Ed25519PrivateKey.generate()
        path = tmp_path / "state" / "node.key"
        write_private_key(path, key)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert node_id_of(read_private_key(path)) == node_id_of(key)
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]  # no temp file left


def test_existing_key_is_never_clobbered_without_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    first = Ed25519PrivateKey.generate()
    write_private_key(path, first)
    with pytest.raises(FileExistsError):
        write_private_key(path, Ed25519PrivateKey.generate())
    assert node_id_of(read_private_key(path)) == node_id_of(first)
    second = Ed25519PrivateKey.generate()
    write_private_key(path, second, overwrite=True)
    assert node_id_of(read_private_key(path)) == node_id_of(second)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.key"]


def test_group_readable_key_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    write_private_key(path, Ed25519PrivateKey.generate())
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="0600"):
        read_private_key(path)


def test_garbage_and_huge_key_files_refused(tmp_path: Path) -> None:
    path = tmp_path / "k"
    atomic_write_raw(path, b"not a key")
    with pytest.raises(KeyFileError):
        read_private_key(path)
    big = tmp_path / "big"
    atomic_write_raw(big, b"A" * 10_000)
    with pytest.raises(KeyFileError, match="too large"):
        read_private_key(big)
    with pytest.raises(KeyFileError):
        read_private_key(tmp_path / "missing")
