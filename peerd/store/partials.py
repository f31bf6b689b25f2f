"""Entry transfers that were cut, kept so that the next session asks only for the rest.

Over a slow or lossy link a 44 MB entry takes tens of seconds, and a connection that drops at
40 MB used to cost all 44 MB again. When an entry frame ends early, the spooled bytes
(:class:`peerd.store.spool.SpoolWriter` keeps them instead of deleting them) are held here
as a :class:`Partial` if their head names an entry; a later session with a peer that
announces the same entry (same origin, version and payload SHA-256) and the resume
capability asks for it from the byte it stopped at
(:data:`peerd.protocol.messages.RESUME_CAPABILITY`), and the tail is appended to the same
file. The whole entry is then verified as any other: the kept bytes are never trusted on
their own, so a member that sent garbage before cutting the stream gets a refused entry
(and the partial is gone with it), nothing else.

Bounds (a member could cut transfers on purpose): at most :data:`MAX_PARTIALS` files, each
at most one entry frame, the oldest unclaimed one evicted first; each kept at most
:data:`PARTIAL_TTL_S`; less than :data:`MIN_RESUME_BYTES` of payload is not worth a round
trip and is deleted at once. The files are temporary files of the spool directory: a
restarted daemon deletes them with every other leftover (they are only hints).

A partial is *claimed* by the session that asked to resume it (so that two sessions never
append to one file) and released when that session ends without the tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from peerd.protocol import messages as msg
from peerd.protocol.entry import EntryBody
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import MAX_ENTRY_HEAD_LEN
from peerd.store.spool import PIECE_LEN, Cut, MappedFrame
from peerd.store.statefile import HEADER_LEN, pack_header

log = logging.getLogger(__name__)

#: Cut transfers kept at once. Threat: a member cutting every transfer on purpose fills the
#: disk; 4 × the entry frame limit at most (the spool receives that much anyway).
MAX_PARTIALS = 4
#: A partial older than this is deleted: its entry has likely been superseded.
PARTIAL_TTL_S = 900.0
#: Fewer payload bytes than this are fetched again rather than resumed.
MIN_RESUME_BYTES = 1024 * 1024


@dataclass(slots=True)
class Partial:
    origin: str
    version: int
    digest: bytes  # the payload SHA-256 its (unverified) head names
    head_len: int  # of the original frame: its map, envelope included
    have: int  # payload bytes held
    payload_len: int
    cut: Cut
    kept_at: float
    claimed_by: int | None = None

    def complete(self, tail: memoryview | bytes | bytearray) -> MappedFrame:
        """Append the rest of the payload and map the whole frame as received (uncommitted:
        it is deleted when dropped unless verified and committed). ValueError when ``tail``
        is not exactly the rest; OSError from the disk."""
        if len(tail) != self.payload_len - self.have:
            raise ValueError(f"{len(tail)} bytes for the {self.payload_len - self.have} "
                             f"left of {self.origin[:16]}@{self.version}")
        data = memoryview(tail).cast("B")
        h = self.cut.sha256.copy()
        fd = os.open(self.cut.path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            offset = HEADER_LEN + self.cut.filled
            for lo in range(0, len(data), PIECE_LEN):
                piece = data[lo : lo + PIECE_LEN]
                h.update(piece)
                while piece:
                    written = os.pwrite(fd, piece, offset)
                    piece, offset = piece[written:], offset + written
            os.pwrite(fd, pack_header(self.cut.frame_len, h.digest()), 0)
        finally:
            os.close(fd)
        return MappedFrame(self.cut.path, committed=False)

    def unlink(self) -> None:
        with contextlib.suppress(OSError):
            self.cut.path.unlink()


def _read_head(cut: Cut) -> Partial | None:
    """The entry the cut frame's head names, or None (no complete entry head: not resumable).
    The head is not verified here; the completed entry is, as a whole."""
    with open(cut.path, "rb", buffering=0) as fh:
        fh.seek(HEADER_LEN)
        prefix = fh.read(min(cut.filled, MAX_ENTRY_HEAD_LEN + 1))
    try:
        message = msg.decode_frame(prefix)
        if not isinstance(message, msg.Entry) or message.offset:
            return None
        body = EntryBody.from_bytes(bytes(message.envelope.body))
    except ProtocolError:
        return None
    head_len = len(prefix) - len(message.payload)
    if head_len + body.payload_len != cut.frame_len:
        return None
    return Partial(body.origin, body.version, bytes.fromhex(body.digest), head_len,
                   cut.filled - head_len, body.payload_len, cut, 0.0)


class Partials:
    """The cut transfers a node holds (thread-safe: heads are read in a worker)."""

    def __init__(self, *, max_partials: int = MAX_PARTIALS, ttl_s: float = PARTIAL_TTL_S,
                 min_bytes: int = MIN_RESUME_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_partials
        self._ttl = ttl_s
        self._min = min_bytes
        self._clock = clock
        self._held: dict[tuple[str, int], Partial] = {}
        self._lock = threading.Lock()
        #: Since start: transfers kept, resumed (asked for from an offset), payload bytes
        #: not sent again thanks to them.
        self.kept = 0
        self.resumed = 0
        self.bytes_saved = 0

    def __len__(self) -> int:
        return len(self._held)

    def keep(self, cut: Cut) -> Partial | None:
        """Hold a cut frame if it is worth resuming; otherwise delete its file."""
        try:
            partial = _read_head(cut)
        except OSError:
            partial = None
        if partial is None or not self._min <= partial.have < partial.payload_len:
            with contextlib.suppress(OSError):
                cut.path.unlink()
            return None
        partial.kept_at = self._clock()
        with self._lock:
            self._expire()
            key = (partial.origin, partial.version)
            old = self._held.get(key)
            if old is not None and (old.claimed_by is not None or old.have >= partial.have):
                partial.unlink()  # the one held goes further (or is in use): keep it
                return None
            if old is not None:
                old.unlink()
            free = [p for p in self._held.values() if p.claimed_by is None]
            if old is None and len(self._held) >= self._max:
                if not free:
                    partial.unlink()
                    return None
                oldest = min(free, key=lambda p: p.kept_at)
                del self._held[(oldest.origin, oldest.version)]
                oldest.unlink()
            self._held[key] = partial
            self.kept += 1
        log.info("kept %d of %d bytes of %s@%d to resume", partial.have, partial.payload_len,
                 partial.origin[:16], partial.version)
        return partial

    def resume(self, session: int, want: msg.Want, offered: msg.Digest) -> msg.Want:
        """``want`` with the offsets of the partials it can resume (the peer announced the
        same payload digest), each claimed by ``session``."""
        digests = {(i.origin, i.version): i.digest for i in offered.entries}
        offsets = []
        with self._lock:
            self._expire()
            for item in want.items:
                p = self._held.get(item)
                if p is not None and p.claimed_by is None and digests.get(item) == p.digest:
                    p.claimed_by = session
                    offsets.append(p.have)
                else:
                    offsets.append(0)
        return msg.Want(want.items, tuple(offsets)) if any(offsets) else want

    def take(self, session: int, origin: str, version: int) -> Partial | None:
        """The partial ``session`` claimed for that entry, no longer held here (the caller
        completes it, or unlinks it)."""
        with self._lock:
            p = self._held.get((origin, version))
            if p is None or p.claimed_by != session:
                return None
            del self._held[(origin, version)]
            self.resumed += 1
            self.bytes_saved += p.have
            return p

    def release(self, session: int) -> None:
        """The session ended: what it claimed and did not take may be resumed by another."""
        with self._lock:
            for p in self._held.values():
                if p.claimed_by == session:
                    p.claimed_by = None

    def clear(self) -> None:
        with self._lock:
            for p in self._held.values():
                p.unlink()
            self._held.clear()

    def _expire(self) -> None:
        now = self._clock()
        for key, p in list(self._held.items()):
            if p.claimed_by is None and now - p.kept_at > self._ttl:
                del self._held[key]
                p.unlink()
