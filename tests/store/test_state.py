"""Crash-safe state: atomic writes, corruption quarantined, counters resumed, audit rotated."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path

import pytest

import peerd.store.statedir as state_mod
from peerd.store.statedir import (
    CACHE_INDEX_BLOB,
    ENTRY_BLOB_PREFIX,
    Counters,
    IndexRow,
    PersistedEntry,
    StateDir,
    StateError,
    encode_cache_index,
    persisted_cache,
    read_cache_index,
)
from peerd.store.statefile import HEADER_LEN, atomic_write
from tests.tmpfs import tiny_tmpfs


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_round_trip_and_listing(tmp_path: Path) -> None:
    sd = StateDir(tmp_path / "state")
    sd.write_blob("entry.a", b"alpha")
    sd.write_blob("entry.b", b"")
    sd.write_blob("checkpoint", bytes(range(256)) * 10)
    assert sd.read_blob("entry.a") == b"alpha"
    assert sd.read_blob("entry.b") == b""
    assert sd.read_blob("checkpoint") == bytes(range(256)) * 10
    assert sd.read_blob("missing") is None
    assert sd.list_blobs("entry.") == ["entry.a", "entry.b"]
    sd.write_blob("entry.a", b"newer")
    assert sd.read_blob("entry.a") == b"newer"
    assert sd.delete_blob("entry.a") is True
    assert sd.delete_blob("entry.a") is False
    assert sd.list_blobs() == ["checkpoint", "entry.b"]


def test_permissions(tmp_path: Path) -> None:
    old = os.umask(0o002)  # a loose umask: the modes must not depend on it
    try:
        loose = tmp_path / "state"
        loose.mkdir(mode=0o775)
        sd = StateDir(loose)
        sd.write_blob("x", b"1")
        sd.save_counters(Counters(1, 1))
        sd.audit("start")
    finally:
        os.umask(old)
    assert mode(loose) == 0o700  # tightened: the identity key lives here
    assert mode(sd.blobs) == 0o700
    assert mode(sd.blobs / "x") == 0o600
    assert mode(loose / "counters.a") == 0o600
    assert mode(sd.audit_path) == 0o600


@pytest.mark.parametrize("bad_name", ["../etc/passwd", "a/b", ".hidden", "", "x" * 201, "-x"])
def test_blob_names_are_confined(tmp_path: Path, bad_name: str) -> None:
    sd = StateDir(tmp_path)
    with pytest.raises(ValueError, match="bad blob name"):
        sd.write_blob(bad_name, b"x")


def corrupt_and_read(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    sd = StateDir(tmp_path / "state")
    sd.write_blob("entry.x", b"signed entry frame" * 100)
    path = sd.blobs / "entry.x"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: HEADER_LEN + 50]
    elif damage == "bitflip":
        data[HEADER_LEN + 7] ^= 0x04
    elif damage == "header":
        data = data[:10]
    elif damage == "magic":
        data[0:4] = b"JUNK"
    elif damage == "appended":
        data += b"garbage"
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="peerd.store.statedir"):
        assert sd.read_blob("entry.x") is None
    assert not path.exists()
    moved = list(sd.quarantine.iterdir())
    assert len(moved) == 1
    assert moved[0].name.startswith("entry.x.")
    assert moved[0].read_bytes() == bytes(data)  # kept as found, for inspection
    assert "corrupt state file" in caplog.text
    assert sd.list_blobs() == []
    # The name is usable again.
    sd.write_blob("entry.x", b"fresh")
    assert sd.read_blob("entry.x") == b"fresh"


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "header", "magic", "appended"])
def test_corrupt_files_are_quarantined(tmp_path: Path, damage: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    corrupt_and_read(tmp_path, damage, caplog)


def test_quarantine_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "MAX_QUARANTINE_FILES", 3)
    sd = StateDir(tmp_path)
    for i in range(6):
        (sd.blobs / f"b{i}").write_bytes(b"not a state file")
        assert sd.read_blob(f"b{i}") is None
    assert len(list(sd.quarantine.iterdir())) == 3


def test_leftover_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.write_blob("keep", b"k")
    (sd.blobs / ".tmp-keep-123-abcd").write_bytes(b"half a write")
    (tmp_path / ".tmp-counters.a-9-ff").write_bytes(b"half")
    StateDir(tmp_path)
    assert sorted(p.name for p in sd.blobs.iterdir()) == ["keep"]
    assert not (tmp_path / ".tmp-counters.a-9-ff").exists()
    assert sd.read_blob("keep") == b"k"


def test_enospc_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd = StateDir(tmp_path)
    sd.write_blob("entry.x", b"old contents")
    real_write = os.write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:  # a partial write first, then the disk is full
            return real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(StateError) as err:
        sd.write_blob("entry.x", b"new contents that do not fit" * 100)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC
    assert "disk full" in str(err.value)
    assert "previous copy is intact" in str(err.value)
    assert sd.read_blob("entry.x") == b"old contents"
    assert [p.name for p in sd.blobs.iterdir()] == ["entry.x"]  # no temp file left


def test_enospc_on_a_real_tiny_tmpfs(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "tiny") as mnt:
        sd = StateDir(mnt / "state")
        sd.write_blob("entry.x", b"old")
        with pytest.raises(StateError, match="disk full"):
            sd.write_blob("entry.x", b"\x01" * 200_000)
        assert sd.read_blob("entry.x") == b"old"
        assert sd.list_blobs() == ["entry.x"]


def test_counters_resume_and_survive_one_corrupt_copy(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    assert sd.load_counters() == Counters(0, 0, lost=False)
    sd.save_counters(Counters(round=41, version=17))
    assert StateDir(tmp_path).load_counters() == Counters(41, 17)
    (tmp_path / "counters.a").write_bytes(b"torn")
    again = StateDir(tmp_path).load_counters()
    assert again == Counters(41, 17)  # the second copy carries on
    assert len(list(sd.quarantine.iterdir())) == 1


def test_counters_take_the_highest_copy(tmp_path: Path) -> None:
    # A crash between writing copy a and copy b leaves a newer; it must win.
    sd = StateDir(tmp_path)
    sd.save_counters(Counters(5, 5))
    atomic_write(tmp_path / "counters.a", json.dumps({"round": 6, "version": 6}).encode())
    assert sd.load_counters() == Counters(6, 6)


def test_all_counter_copies_lost_is_flagged(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.save_counters(Counters(9, 9))
    for name in ("counters.a", "counters.b"):
        (tmp_path / name).write_bytes(b"\x00" * 80)
    lost = sd.load_counters()
    assert lost.lost
    assert (lost.round, lost.version) == (0, 0)


def test_counters_with_nonsense_inside_are_rejected(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    for name in ("counters.a", "counters.b"):
        atomic_write(tmp_path / name, b'{"round": -1, "version": 2}')
    assert sd.load_counters().lost
    with pytest.raises(ValueError, match="counters must be >= 0"):
        sd.save_counters(Counters(-1, 0))


def test_audit_log_appends_and_rotates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "MAX_AUDIT_BYTES", 400)
    sd = StateDir(tmp_path)
    for i in range(40):
        assert sd.audit("accepted", origin=f"node{i}", version=i)
    records = sd.read_audit()
    files = sorted(p.name for p in tmp_path.glob("audit.log*"))
    assert files == ["audit.log", "audit.log.1", "audit.log.2", "audit.log.3"]
    assert all(p.stat().st_size <= 400 for p in tmp_path.glob("audit.log*"))
    versions = [r["version"] for r in records]
    assert versions == sorted(versions)  # order kept
    assert versions[-1] == 39  # oldest dropped
    assert len(versions) < 40


def test_audit_line_is_bounded(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.audit("rejected", detail="x" * 100_000)
    (record,) = sd.read_audit()
    assert record["truncated"] is True
    assert len(sd.audit_path.read_bytes()) < 5000


def test_audit_failure_is_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd = StateDir(tmp_path)

    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    assert sd.audit("accepted") is False


def test_unusable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StateError, match="cannot use state directory"):
        StateDir(blocker / "state")


def test_cache_index_format_and_typed_reading(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    rows = {"A": IndexRow(3, "B", 1.5), "C": IndexRow(1, None, 7)}
    # The daemon's index as earlier releases wrote it: byte for byte.
    assert encode_cache_index(rows) == (
        b'{"A": {"version": 3, "received_from": "B", "received_at": 1.5}, '
        b'"C": {"version": 1, "received_from": null, "received_at": 7}}')
    sd.write_blob(CACHE_INDEX_BLOB, encode_cache_index(rows))
    assert read_cache_index(sd) == rows
    # Unverified data on disk: wrong types become unknown, never an error.
    odd = {"A": {"version": "3", "received_from": 5, "received_at": True}, "B": [1], "C": {}}
    sd.write_blob(CACHE_INDEX_BLOB, json.dumps(odd).encode())
    assert read_cache_index(sd) == {"A": IndexRow(), "B": IndexRow(), "C": IndexRow()}
    for junk in (b"[1, 2]", b"not json"):
        sd.write_blob(CACHE_INDEX_BLOB, junk)
        assert read_cache_index(sd) == {}
    sd.delete_blob(CACHE_INDEX_BLOB)
    assert read_cache_index(sd) == {}


def test_persisted_cache_lists_entry_files_with_their_index_rows(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.write_blob(f"{ENTRY_BLOB_PREFIX}A", b"frame a")
    sd.write_blob(f"{ENTRY_BLOB_PREFIX}B", b"frame bb")
    sd.write_blob("own.entry", b"not listed")
    sd.write_blob(CACHE_INDEX_BLOB, encode_cache_index({"A": IndexRow(4, "C", 9.0)}))
    assert persisted_cache(StateDir(tmp_path, readonly=True)) == [
        PersistedEntry(origin="A", blob="entry-A", size=HEADER_LEN + 7, version=4,
                       received_from="C", received_at=9.0),
        PersistedEntry(origin="B", blob="entry-B", size=HEADER_LEN + 8, version=None,
                       received_from=None, received_at=None)]
