"""The state-file format and the one atomic write: round trips, corruption caught, old-or-new."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from peerd.store.statefile import (
    HEADER_LEN,
    StateError,
    atomic_write,
    atomic_write_raw,
    decode,
    encode,
    parse_header,
    read_body,
)


def read(path: Path, limit: int = 1 << 30) -> bytes:
    with path.open("rb") as fh:
        return read_body(fh, limit)


def test_the_on_disk_format_is_fixed() -> None:
    # Written out from the format's definition, not from the code: state directories made by
    # earlier releases must keep loading, so this must never change silently.
    body = b"abc"
    expected = (b"PEERDST\x00" + b"\x00\x01" + b"\x00\x00" + (3).to_bytes(8, "big")
                + hashlib.sha256(body).digest() + body)
    assert HEADER_LEN == 52
    assert encode(body) == expected
    assert decode(expected) == body


def test_round_trip_whole_and_in_parts(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    atomic_write(path, b"hello")
    assert read(path) == b"hello"
    assert path.read_bytes() == encode(b"hello")
    big = bytes(range(256)) * 4000
    atomic_write(path, [b"head", memoryview(big), bytearray(b"tail")])
    assert read(path) == b"head" + big + b"tail"
    assert path.read_bytes() == encode(b"head" + big + b"tail")
    atomic_write(path, b"")
    assert read(path) == b""
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["blob"]  # no temporary file left


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda d: d[: HEADER_LEN + 3], "torn"),
    (lambda d: d + b"x", "torn"),
    (lambda d: d[:10], "shorter than"),
    (lambda d: b"JUNK" + d[4:], "bad magic"),
    (lambda d: d[:8] + b"\x00\x09" + d[10:], "format version"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 0x10]), "SHA-256"),
    (lambda d: d[:HEADER_LEN] + bytes([d[HEADER_LEN] ^ 1]) + d[HEADER_LEN + 1 :], "SHA-256"),
])
def test_torn_or_corrupt_files_are_detected(
    tmp_path: Path, damage: Callable[[bytes], bytes], reason: str
) -> None:
    path = tmp_path / "blob"
    atomic_write(path, b"a signed entry frame" * 50)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=reason):
        read(path)


def test_read_refuses_a_body_over_the_limit_before_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    atomic_write(path, b"x" * 100)
    assert read(path, limit=100) == b"x" * 100
    with pytest.raises(ValueError, match="over the 99-byte limit"):
        read(path, limit=99)


def test_parse_header_checks_the_length_against_the_file() -> None:
    data = encode(b"12345")
    assert parse_header(data, len(data)) == hashlib.sha256(b"12345").digest()
    with pytest.raises(ValueError, match="torn"):
        parse_header(data, len(data) + 1)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "blob"
    atomic_write(path, b"old")
    real_write = os.write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:  # part of the header reaches the file, then the disk is full
            return real_write(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(StateError, match="disk full") as err:
        atomic_write(path, b"new" * 1000)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC
    assert read(path) == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["blob"]


def test_a_crash_before_the_rename_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "blob"
    atomic_write(path, b"old")

    def crash(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StateError):
        atomic_write(path, b"new")
    monkeypatch.undo()
    assert read(path) == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["blob"]


def test_data_is_synced_before_the_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "blob", b"durable")
    (synced_file, tmp), (renamed, source), (synced_dir, directory) = events
    assert (synced_file, renamed, synced_dir) == ("fsync", "replace", "fsync")
    assert tmp == source
    assert Path(tmp).name.startswith(".tmp-blob-")
    assert directory == str(tmp_path)


def test_raw_write_never_clobbers_without_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    atomic_write_raw(path, b"first")
    with pytest.raises(FileExistsError):
        atomic_write_raw(path, b"second")
    assert path.read_bytes() == b"first"  # no header: a plain file for other programs too
    atomic_write_raw(path, [b"sec", b"ond"], overwrite=True)
    assert path.read_bytes() == b"second"
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]


@pytest.mark.parametrize(("umask", "mode"), [(0o077, 0o644), (0o000, 0o600), (0o022, 0o640)])
def test_raw_write_gives_exactly_the_mode(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write_raw(tmp_path / "f", b"x", mode=mode)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == mode


_WRITER = """
import sys
from pathlib import Path
from peerd.store.statefile import atomic_write
path, size = Path(sys.argv[1]), int(sys.argv[2])
bodies = [bytes([i]) * size for i in range(1, 4)]
print("ready", flush=True)
i = 0
while True:
    atomic_write(path, bodies[i % 3])
    i += 1
"""


def test_a_killed_writer_leaves_the_old_or_the_new_file_never_half(tmp_path: Path) -> None:
    # A real crash: a process replacing a 2 MB state file in a loop is SIGKILLed at random
    # points; each time the file must be one whole version, intact.
    path, size = tmp_path / "blob", 2 * 1024 * 1024
    atomic_write(path, b"\x00" * size)
    seen: set[int] = set()
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(size)],
                                stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        body = read(path)
        assert len(body) == size
        assert body == body[:1] * size
        seen.add(body[0])
    assert seen != {0}  # the writer did replace it: the check above saw new versions
