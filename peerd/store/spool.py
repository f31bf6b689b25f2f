"""Entries that live in state files, mapped read-only: cached models in the page cache.

A node holds its own signed entry and C cached ones, each a model-sized buffer, for as long
as they stay cached. They are written to the state directory anyway (crash safety), so the
daemon keeps them *only* there:

* a received entry frame is written to a temporary file in ``blobs/`` as its bytes arrive
  (:class:`SpoolWriter`, the sink the framing layer writes into), hashed on the way, and
  renamed into place once it has been verified and accepted (:meth:`MappedFrame.commit`);
  a refused one is deleted;
* the own entry is signed from the model's tensors straight into its file;
* each file is then mapped read-only (:class:`MappedFrame`). Verification, blending, drift
  and sending read it tensor by tensor or piece by piece and hand each range back
  (``MADV_DONTNEED``) once read, so the daemon's resident set holds a few tensors of an
  entry rather than the entry, and the kernel may reclaim the rest of the page cache.

Why releasing is safe: every mapping here is a *shared mapping of a file*. Dropping its pages
only unmaps them; the next read faults the same bytes back in from the page cache or the
file. This module never maps anonymous memory, where the same call would zero the data: a
frame that cannot go to disk (disk full) is received into memory instead and is never
released (:class:`SpoolWriter` falls back; such an entry is simply a plain buffer).

Files are never truncated or rewritten in place (atomic replace only makes new inodes), so
a mapping can never lose its bytes underneath a reader (which would be SIGBUS). A disk that
fails while a mapped page is read would also end the process with SIGBUS; the restarted
daemon then re-checks every file with ordinary reads (:func:`open_mapped`) and quarantines
the damaged one instead of mapping it again.

The state-file header and the fsync rules are peerd.store.statefile's; this module must not
define its own, nor decide what an entry means (peerd.store.persist, peerd.node.state).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import mmap
import os
import secrets
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from peerd.node.entryfile import EntryFile
from peerd.store.sinks import MemorySink
from peerd.store.statefile import HEADER_LEN, TMP_PREFIX, fsync_dir, pack_header, parse_header

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
#: Bytes hashed or sent between two releases: large enough that the release calls cost
#: nothing next to the hashing, small enough that at most this much of an entry is resident.
PIECE_LEN = 4 * 1024 * 1024


def _unlink_pending(pending: list[Path]) -> None:
    # A spooled entry that was refused, dropped or evicted before it was committed: its file
    # was never the state of anything, so deleting it loses nothing.
    for path in pending:
        with contextlib.suppress(OSError):
            path.unlink()
    pending.clear()


class MappedFrame:
    """A state file holding one frame body, mapped read-only (header checked, not the hash).

    ``body`` is a read-only view of the frame body. An uncommitted frame (just received)
    deletes its temporary file when it is garbage-collected; :meth:`commit` makes it a
    durable state file instead.
    """

    def __init__(self, path: Path, *, committed: bool = True) -> None:
        # The descriptor is closed once the file is mapped: a daemon that refuses entries
        # all day must not leak one per entry.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_LEN:
                parse_header(b"", size)  # raises: too short
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._size = size
        self.path = path
        self.recorded_sha256 = parse_header(self._map[:HEADER_LEN], size)
        self.body = memoryview(self._map)[HEADER_LEN:].toreadonly()
        self._pending: list[Path] = [] if committed else [path]
        weakref.finalize(self, _unlink_pending, self._pending)

    @property
    def committed(self) -> bool:
        return not self._pending

    def release(self, start: int = 0, end: int | None = None) -> None:
        """Hand the pages of ``body[start:end]`` back to the kernel (a hint; see module doc).

        The range is widened to whole pages: a neighbour's page is faulted back in if it
        is read again, which costs a page fault, never a wrong byte.
        """
        end = len(self.body) if end is None else end
        lo = (HEADER_LEN + max(0, start)) // PAGE * PAGE
        hi = min(self._size, -(-(HEADER_LEN + end) // PAGE) * PAGE)
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def pieces(self, start: int, end: int) -> Iterator[tuple[int, memoryview]]:
        """``(offset, view)`` pieces of ``body[start:end]`` of at most :data:`PIECE_LEN`."""
        for lo in range(start, end, PIECE_LEN):
            yield lo, self.body[lo : min(end, lo + PIECE_LEN)]

    def sha256_tail(self, view: memoryview | bytes | bytearray) -> str:
        """SHA-256 (hex) of ``view``, a tail of :attr:`body` (an entry's payload), read
        piece by piece with each piece released after hashing."""
        data = memoryview(view)
        base = len(self.body) - len(data)
        h = hashlib.sha256()
        for lo in range(0, len(data), PIECE_LEN):
            h.update(data[lo : lo + PIECE_LEN])
            self.release(base + lo, base + lo + PIECE_LEN)
        return h.hexdigest()

    def paged(self, tensors: Mapping[str, torch.Tensor],
              ranges: Mapping[str, tuple[int, int]]) -> Mapping[str, torch.Tensor]:
        """``tensors`` (views into :attr:`body`) as :class:`PagedParams` over this file."""
        return PagedParams(tensors, self, ranges)

    def unlink(self) -> None:
        """Remove an uncommitted file now; the mapping stays readable until it is dropped
        (and a crash can leave nothing behind)."""
        _unlink_pending(self._pending)

    def commit(self, path: Path) -> None:
        """Make a received frame durable as ``path`` (fsync, rename, fsync the directory)."""
        if self.committed:
            raise ValueError(f"{self.path} is already committed")
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)  # the data first, then the name: a crash never leaves a torn entry
        finally:
            os.close(fd)
        os.replace(self.path, path)
        fsync_dir(path.parent)
        self._pending.clear()
        self.path = path


def open_mapped(path: Path, *, check: bool) -> MappedFrame:
    """Map a committed state file; with ``check`` its body hash is verified first (ValueError
    when corrupt, OSError when unreadable).

    The check reads the file with ordinary reads, not through the mapping: a disk that fails
    to read a mapped page kills the process (SIGBUS) instead of raising, so a damaged file
    must be caught here, where it becomes an error the caller quarantines, and never loop a
    restarting daemon into the same crash.
    """
    if check:
        with open(path, "rb", buffering=0) as fh:
            head = fh.read(HEADER_LEN)
            recorded = parse_header(head, os.fstat(fh.fileno()).st_size)
            h = hashlib.sha256()
            while chunk := fh.read(PIECE_LEN):
                h.update(chunk)
        if h.digest() != recorded:
            raise ValueError("SHA-256 mismatch: the body is corrupt")
    return MappedFrame(path)


@dataclass(frozen=True, slots=True)
class Cut:
    """What a :class:`SpoolWriter` with ``keep_cut`` kept of a frame that ended early: the
    file (a state-file header placeholder, then ``filled`` body bytes), the frame's announced
    length and the SHA-256 state of the bytes in hand (peerd.store.partials resumes it)."""

    path: Path
    frame_len: int
    filled: int
    sha256: hashlib._Hash


class SpoolWriter:
    """Receives one frame body into a temporary file in ``directory`` (a framing sink).

    ``begin(n)`` once the length is known, ``write`` for each chunk as it arrives, then
    ``finish()`` (returns the body as a buffer) or ``abort()``. The body's SHA-256 for the
    state-file header is computed from the chunks in hand, so the file is never read back
    to be hashed. :attr:`frame` is the mapped file after ``finish`` — or None when the disk
    refused the bytes (full, read-only): then the frame is received into memory and the
    entry still works, it just is not persisted (logged).
    """

    def __init__(self, directory: Path, *, keep_cut: bool = False) -> None:
        self._dir = directory
        self._keep_cut = keep_cut
        #: With ``keep_cut``: the bytes of a frame that ended early, after ``abort``.
        self.cut: Cut | None = None
        self._fd: int | None = None
        self._path: Path | None = None
        self._mem: MemorySink | None = None
        self._hash = hashlib.sha256()
        self._length = 0
        self._filled = 0
        self.frame: MappedFrame | None = None

    def begin(self, length: int) -> None:
        self._length = length
        self._path = self._dir / f"{TMP_PREFIX}recv-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                               0o600)
            self._write_all(bytes(HEADER_LEN), 0)  # placeholder: the header needs the hash
        except OSError as exc:
            self._fall_back(exc)

    def _write_all(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        assert self._fd is not None
        view = memoryview(data).cast("B")
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def _fall_back(self, exc: OSError) -> None:
        hint = " (disk full)" if exc.errno == errno.ENOSPC else ""
        log.warning("cannot spool a received entry to %s: %s%s; receiving it into memory "
                    "(it will not be persisted)", self._dir, exc.strerror, hint)
        mem = MemorySink()
        mem.begin(self._length)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                done = 0
                while done < self._filled:  # bytes that did reach the file
                    chunk = os.pread(self._fd, min(PIECE_LEN, self._filled - done),
                                     HEADER_LEN + done)
                    if not chunk:
                        break
                    mem.write(chunk)
                    done += len(chunk)
        self._discard_file()
        self._mem = mem

    def write(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        if self._filled + n > self._length:
            raise ValueError("more bytes than the frame announced")
        if self._mem is None:
            try:
                self._write_all(data, HEADER_LEN + self._filled)
            except OSError as exc:
                self._fall_back(exc)
        if self._mem is not None:
            self._mem.write(data)
        self._hash.update(data)
        self._filled += n

    def finish(self) -> memoryview:
        if self._filled != self._length:
            raise ValueError(f"frame incomplete: {self._filled} of {self._length} bytes")
        if self._mem is None:
            try:
                self._write_all(pack_header(self._length, self._hash.digest()), 0)
                assert self._path is not None
                assert self._fd is not None
                self.frame = MappedFrame(self._path, committed=False)
                # Only now: had mapping failed, the fallback reads the bytes back through it.
                os.close(self._fd)
                self._fd = None
                return self.frame.body
            except OSError as exc:
                self._fall_back(exc)
        assert self._mem is not None
        return self._mem.finish().toreadonly()

    def _discard_file(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink()
            self._path = None

    def abort(self) -> None:
        """The frame will not complete (EOF, timeout, cancel): delete what was written, or
        with ``keep_cut`` hand it over as :attr:`cut` (the caller owns the file then)."""
        if (self._keep_cut and self._fd is not None and self._path is not None
                and self._mem is None and 0 < self._filled < self._length):
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            self.cut = Cut(self._path, self._length, self._filled, self._hash.copy())
            self._path = None
        self._discard_file()
        self._mem = None


class PagedParams(Mapping[str, torch.Tensor]):
    """An entry's tensors (views into a :class:`MappedFrame`) that let pages go as they
    are read: fetching one tensor releases the one fetched before.

    Every reader of whole models in peerd (validation, blend, drift) goes tensor by tensor
    in schema order, so at most about one tensor per entry is resident at a time. A reader
    that holds several tensors at once still reads the right values (see the module doc);
    it only keeps more pages resident.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], frame: MappedFrame,
                 ranges: Mapping[str, tuple[int, int]]) -> None:
        self._tensors = dict(tensors)
        self._frame = frame
        self._ranges = dict(ranges)  # name -> (start, end) in frame.body
        self._last: str | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._tensors[name]
        if self._last is not None and self._last != name:
            self._frame.release(*self._ranges[self._last])
        self._last = name
        return t

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def release(self) -> None:
        self._frame.release()
        self._last = None


#: Tensors of a spilled model start at file offsets that are multiples of this, so every
#: dtype's view is aligned (the state-file header is 52 bytes).
SPILL_ALIGN = 64


def spill(params: Mapping[str, torch.Tensor], directory: Path) -> Mapping[str, torch.Tensor]:
    """A read-only copy of ``params`` kept in an unlinked file in ``directory``, as
    :class:`PagedParams`: the daemon's x̄ while a round trains.

    The proximal term reads x̄ once per parameter and step; from here each read pages one
    tensor in and lets the previous one go, so x̄ is not a second resident model. The file is
    unlinked at once: its pages live in the page cache (the kernel may write them out and
    drop them under memory pressure) and vanish with the last view, a crash leaves nothing.
    If the directory refuses the bytes, the copy is made in memory instead.
    """
    layout: dict[str, tuple[int, int]] = {}
    body_len = 0
    for name, t in params.items():
        start = body_len + (-(HEADER_LEN + body_len) % SPILL_ALIGN)
        nbytes = t.numel() * t.element_size()
        layout[name] = (start, start + nbytes)
        body_len = start + nbytes
    sink = SpoolWriter(directory)
    sink.begin(body_len)
    try:
        filled = 0
        for name, t in params.items():
            start, end = layout[name]
            if start > filled:
                sink.write(bytes(start - filled))
            raw = t.detach().contiguous()
            if raw.dtype == torch.bfloat16:  # no numpy dtype: the same 2-byte words as int16
                raw = raw.view(torch.int16)
            sink.write(raw.numpy().reshape(-1).view("u1").data)
            filled = end
        sink.finish()
    except BaseException:
        sink.abort()
        raise
    frame = sink.frame
    if frame is None:  # the disk refused it (logged by SpoolWriter): hold x̄ in memory
        return {name: t.detach().clone() for name, t in params.items()}
    frame.unlink()
    views: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        # Read-only buffer: torch warns that writes would be undefined; x̄ is never written.
        warnings.simplefilter("ignore", UserWarning)
        for name, t in params.items():
            start, end = layout[name]
            dtype = torch.int16 if t.dtype == torch.bfloat16 else t.dtype
            flat = torch.frombuffer(frame.body[start:end], dtype=dtype) if end > start else (
                torch.empty(0, dtype=dtype))
            flat = flat.view(torch.bfloat16) if t.dtype == torch.bfloat16 else flat
            views[name] = flat.view(t.shape)
    return PagedParams(views, frame, layout)


def send_parts(
    head: bytes, frame: EntryFile, payload: memoryview | bytes | bytearray
) -> tuple[list[bytes | memoryview], Callable[[int], None]]:
    """``[head, *pieces of payload]`` for a vectored send, and the callback the framing layer
    calls after writing part ``i``: it releases that piece, so a send keeps at most one
    piece of the entry resident. ``payload`` is a tail of ``frame.body``."""
    base = len(frame.body) - len(payload)
    pieces = list(frame.pieces(base, len(frame.body)))
    parts: list[bytes | memoryview] = [head, *(view for _, view in pieces)]

    def written(index: int) -> None:
        if index >= 1:
            lo, view = pieces[index - 1]
            frame.release(lo, lo + len(view))

    return parts, written
