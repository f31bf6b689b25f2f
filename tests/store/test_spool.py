"""Entries kept in mapped state files (peerd.store.spool): same bytes, pages handed back,
no leftovers.

Resident pages of a mapping are read from /proc/self/smaps, the kernel's own account.
"""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path

import pytest
import torch

from peerd.store import spool
from peerd.store.spool import PIECE_LEN, MappedFrame, PagedParams, SpoolWriter, open_mapped
from peerd.store.statedir import StateDir
from tests.tmpfs import tiny_tmpfs

MB = 1024 * 1024


def resident_kb(path: Path) -> int:
    """Resident KiB of every mapping of ``path`` in this process (0 when unmapped)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(maxsplit=5)
        if len(first) >= 5 and "-" in first[0] and ":" in first[3]:
            inside = len(first) == 6 and first[5] in (str(path), f"{path} (deleted)")
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def spooled(directory: Path, body: bytes, chunk: int = 64 * 1024) -> SpoolWriter:
    sink = SpoolWriter(directory)
    sink.begin(len(body))
    for lo in range(0, len(body), chunk):
        sink.write(body[lo : lo + chunk])
    return sink


def body_of(n: int, seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes()


def test_a_spooled_frame_reads_back_byte_for_byte_and_its_released_pages_leave_rss(
    tmp_path: Path,
) -> None:
    body = body_of(8 * MB + 123)
    sink = spooled(tmp_path, body)
    view = sink.finish()
    assert sink.frame is not None
    path = sink.frame.path
    assert bytes(view) == body  # reading faults every page in
    assert resident_kb(path) >= 8 * 1024
    sink.frame.release()
    assert resident_kb(path) < 64  # handed back...
    assert bytes(view) == body  # ...and read again from the page cache, unchanged


def test_hashing_a_mapped_payload_never_holds_more_than_a_piece_of_it(tmp_path: Path) -> None:
    import hashlib

    body = body_of(6 * PIECE_LEN, seed=1)
    sink = spooled(tmp_path, body)
    sink.finish()
    frame = sink.frame
    assert frame is not None
    tail = frame.body[100:]
    assert frame.sha256_tail(tail) == hashlib.sha256(body[100:]).hexdigest()
    assert resident_kb(frame.path) <= (PIECE_LEN + 2 * 4096) // 1024


def test_a_refused_spooled_entry_leaves_no_file_behind(tmp_path: Path) -> None:
    sink = spooled(tmp_path, body_of(3 * MB))
    view = sink.finish()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".tmp-recv-")
    del view, sink
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_receive_leaves_no_file_behind(tmp_path: Path) -> None:
    sink = SpoolWriter(tmp_path)
    sink.begin(10 * MB)
    sink.write(b"x" * MB)
    sink.abort()  # what peerd.net.framing does on EOF, timeout or cancellation
    assert list(tmp_path.iterdir()) == []


def test_a_peer_cannot_write_past_the_length_it_announced(tmp_path: Path) -> None:
    sink = SpoolWriter(tmp_path)
    sink.begin(10)
    with pytest.raises(ValueError, match="more bytes"):
        sink.write(b"y" * 11)
    sink.abort()


def test_a_committed_frame_is_an_ordinary_state_file(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    body = body_of(2 * MB + 5, seed=2)
    sink = spooled(state.blobs, body)
    sink.finish()
    assert sink.frame is not None
    sink.frame.commit(state.blob_path("entry-x"))
    del sink
    gc.collect()
    # The regular reader (header, length, SHA-256) accepts it: one format on disk.
    assert state.read_blob("entry-x") == body
    assert [p.name for p in state.blobs.iterdir()] == ["entry-x"]
    assert open_mapped(state.blob_path("entry-x"), check=True).body.tobytes() == body


def test_a_corrupt_committed_file_fails_its_check(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    state.write_blob("entry-y", body_of(MB, seed=3))
    path = state.blob_path("entry-y")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="SHA-256"):
        open_mapped(path, check=True)


def test_a_full_disk_mid_receive_falls_back_to_memory_and_loses_no_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = body_of(5 * MB, seed=4)
    real_pwrite = os.pwrite
    written = [0]

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if written[0] > 2 * MB:
            raise OSError(errno.ENOSPC, "No space left on device")
        written[0] += len(data)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    sink = spooled(tmp_path, body)
    view = sink.finish()
    assert sink.frame is None  # held in memory: nothing to release, nothing mapped
    assert bytes(view) == body
    assert list(tmp_path.iterdir()) == []  # the partial file is gone


def test_an_unwritable_spool_directory_falls_back_to_memory(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    sink = spooled(missing, b"abc" * 1000)
    assert bytes(sink.finish()) == b"abc" * 1000
    assert sink.frame is None


def test_paged_params_let_the_previous_tensor_go_when_the_next_is_read(tmp_path: Path) -> None:
    a = torch.arange(2 * MB // 4, dtype=torch.float32)
    b = -torch.arange(2 * MB // 4, dtype=torch.float32)
    held = spool.spill({"a": a, "b": b}, tmp_path)
    assert isinstance(held, PagedParams)
    frame = held._frame
    assert torch.equal(held["a"], a)  # reads a's pages
    a_kb = resident_kb(frame.path)
    assert a_kb >= 2 * 1024
    assert torch.equal(held["b"], b)  # fetching b releases a
    assert resident_kb(frame.path) <= a_kb + 8
    held.release()
    assert resident_kb(frame.path) < 16


def test_spill_keeps_every_dtype_exact_and_aligned_and_leaves_no_file(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(5)
    params = {
        "w": torch.randn(7, 5, generator=g),
        "d": torch.randn(3, generator=g, dtype=torch.float64),
        "h": torch.randn(9, generator=g).to(torch.bfloat16),
        "n": torch.tensor(12345678901, dtype=torch.int64),
        "e": torch.empty(0, 4),
        "t": torch.randn(4, 6, generator=g).t(),  # not contiguous
    }
    copy = spool.spill(params, tmp_path)
    assert list(tmp_path.iterdir()) == []  # unlinked at once: a crash leaves nothing
    for name, t in params.items():
        got = copy[name]
        assert got.dtype == t.dtype
        assert got.shape == t.shape
        assert torch.equal(got, t), name
        if got.numel():
            assert got.data_ptr() % 8 == 0
    params["w"].add_(1.0)  # a copy: training the model does not move x̄
    assert not torch.equal(copy["w"], params["w"])


def test_release_of_an_in_memory_entry_changes_nothing(tmp_path: Path) -> None:
    from peerd.node.state import Held, sign_own
    from tests.node.fleet import FLEET, NOW, key, model

    entry, message = sign_own(key(1), FLEET, params=model(1), version=1, created_at=NOW,
                              num_examples=3)
    held = Held(entry, message)  # no frame: anonymous memory must never be "released"
    before = bytes(message.payload)
    held.release()
    assert bytes(message.payload) == before


def test_mapping_a_file_shorter_than_the_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"PEERD")
    with pytest.raises(ValueError, match="shorter"):
        MappedFrame(path)


def test_a_receive_onto_a_really_full_filesystem_is_held_in_memory(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "tiny") as mnt:
        body = body_of(MB, seed=6)
        sink = spooled(mnt, body)
        assert bytes(sink.finish()) == body
        assert sink.frame is None
        assert list(mnt.iterdir()) == []


def test_spooling_entries_all_day_leaks_no_file_descriptor(tmp_path: Path) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    kept = []
    for i in range(20):
        sink = spooled(tmp_path, body_of(64 * 1024, seed=i))
        sink.finish()
        assert sink.frame is not None
        if i % 2:  # half are accepted and committed, half refused and dropped
            sink.frame.commit(tmp_path / f"entry-{i}")
            kept.append(sink.frame)
    del sink
    gc.collect()
    # A live mapping holds one descriptor (CPython's mmap keeps a duplicate): bounded by
    # the cache, C + 1. Dropped entries hold none.
    assert open_fds() <= before + len(kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"entry-{i}" for i in
                                                                range(1, 20, 2))
    kept.clear()
    gc.collect()
    assert open_fds() == before
