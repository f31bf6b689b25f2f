"""The participation audit on disk: one checksummed line per round, bounded, kept across
restarts (``rounds.log`` in the state directory).

Each line is ``<sha256 hex> <round> <body>\\n``; the digest covers ``<round> <body>``, so a torn
or flipped line is recognised and skipped with a warning, never trusted and never fatal (a
power cut can tear the last append). The file is bounded by records and by bytes
(:data:`MAX_ROUND_RECORDS`, :data:`MAX_ROUND_LOG_BYTES`): past either, the oldest records are
dropped and the rest rewritten atomically (peerd.store.statefile's temporary file, fsync,
rename). A writer that finds damaged lines at start-up rewrites the file without them, so its
appends never follow a torn line.

A writer keeps the file's records in memory as well (bounded the same way), so the running
daemon answers ``peerd audit`` without reading the disk on its event loop. Only the daemon
holding the state directory's lock (peerd.store.lock) writes; readers open it read-only.

Owns the file's format and bounds only: bodies are opaque bytes (one line, no newline; the
daemon writes JSON, :mod:`peerd.control.audit` defines it). It must not touch any other file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from peerd.store.statefile import StateError, atomic_write_raw

log = logging.getLogger(__name__)

#: File name inside a state directory.
ROUND_LOG_FILE = "rounds.log"
#: Most records kept: a node that runs for years must not grow its state directory (or the
#: answer `peerd audit` reads) without bound. A round a minute keeps about three days.
MAX_ROUND_RECORDS = 5000
#: Most bytes kept (all lines): a fleet of hundreds of members makes each record large, and
#: the file must stay far below the disk the cache needs and below the control socket's
#: largest answer (peerd.control.client.MAX_RESPONSE_LEN, 16 MiB).
MAX_ROUND_LOG_BYTES = 8 * 1024**2
#: Largest body of one record: a round's record lists at most C members and a bounded
#: number of refusals (peerd.daemon.participation); a bigger one is a bug, refused here.
MAX_ROUND_RECORD_BYTES = 256 * 1024
#: When a bound is passed, the file is cut to this fraction of it, so the rewrite that
#: drops the oldest records happens once in many rounds rather than every round.
_KEEP_FRACTION = 0.75
_DIGEST_HEX = 64


@dataclass(frozen=True, slots=True)
class RoundLine:
    """One intact record: its round index and its body."""

    round: int
    body: bytes


@dataclass(frozen=True, slots=True)
class RoundLogRead:
    """What a read found: the intact records, oldest first, and how many lines were skipped
    as torn or corrupt."""

    records: tuple[RoundLine, ...]
    skipped: int


def _line(index: int, body: bytes) -> bytes:
    payload = b"%d %s" % (index, body)
    return hashlib.sha256(payload).hexdigest().encode() + b" " + payload + b"\n"


def _parse(line: bytes) -> RoundLine | None:
    """The record of one line (without its newline), or None if it is not intact."""
    if len(line) < _DIGEST_HEX + 3 or line[_DIGEST_HEX:_DIGEST_HEX + 1] != b" ":
        return None
    digest, payload = line[:_DIGEST_HEX], line[_DIGEST_HEX + 1:]
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    index, sep, body = payload.partition(b" ")
    if not sep or not index.isdigit() or len(index) > 19:
        return None
    return RoundLine(int(index), body)


def parse_log(data: bytes) -> RoundLogRead:
    """The records of a whole file's bytes; a line without its newline (a torn append) or
    failing its digest counts as skipped."""
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, or a torn append
    records: list[RoundLine] = []
    skipped = 1 if tail else 0
    for raw in lines:
        parsed = _parse(raw)
        if parsed is None:
            skipped += 1
        else:
            records.append(parsed)
    return RoundLogRead(tuple(records), skipped)


def read_round_log(state_dir: Path) -> RoundLogRead:
    """Read-only: the records in ``state_dir``'s round log (none if it is absent). Damaged
    lines are skipped with a warning; nothing is written (a daemon may hold the directory)."""
    path = state_dir / ROUND_LOG_FILE
    try:
        with path.open("rb") as fh:
            # Bounded read, of the newest records: a file that is not ours (or one written
            # under larger bounds) must not make us allocate gigabytes.
            cap = MAX_ROUND_LOG_BYTES + MAX_ROUND_RECORD_BYTES
            size = os.fstat(fh.fileno()).st_size
            if size > cap:
                fh.seek(size - cap)
                fh.readline()  # the rest of a line cut by the seek: not a record
            data = fh.read(cap)
    except FileNotFoundError:
        return RoundLogRead((), 0)
    except OSError as exc:
        raise StateError(exc.errno, f"cannot read {path}: {exc.strerror}") from exc
    found = parse_log(data)
    if found.skipped:
        log.warning("%s: skipped %d torn or corrupt record(s)", path, found.skipped)
    return found


def _bounded(records: Iterable[RoundLine], max_records: int, max_bytes: int
             ) -> tuple[list[RoundLine], int]:
    """The newest records that fit the bounds, and their size in bytes."""
    kept: list[RoundLine] = []
    size = 0
    for r in reversed(list(records)):
        n = len(_line(r.round, r.body))
        if len(kept) >= max_records or size + n > max_bytes:
            break
        kept.append(r)
        size += n
    kept.reverse()
    return kept, size


class RoundLog:
    """The writer: the state directory's round log, mirrored in memory. Thread-safe (the
    daemon appends from its loop thread; a control request reads from it)."""

    def __init__(self, state_dir: Path, *, max_records: int = MAX_ROUND_RECORDS,
                 max_bytes: int = MAX_ROUND_LOG_BYTES) -> None:
        self.path = state_dir / ROUND_LOG_FILE
        self.max_records, self.max_bytes = max_records, max_bytes
        self._lock = threading.Lock()
        found = read_round_log(state_dir)
        kept, self._size = _bounded(found.records, max_records, max_bytes)
        self._records: deque[RoundLine] = deque(kept)
        if found.skipped or len(kept) < len(found.records):
            self._rewrite()  # appends must not follow a torn line

    def _rewrite(self) -> None:
        data = b"".join(_line(r.round, r.body) for r in self._records)
        atomic_write_raw(self.path, data, overwrite=True)
        self._size = len(data)

    def append(self, index: int, body: bytes) -> None:
        """Add round ``index``'s record; the oldest ones go once a bound is passed.
        ValueError for a body that is not one bounded line; OSError when the disk fails (the
        record is then kept in memory only)."""
        if b"\n" in body or len(body) > MAX_ROUND_RECORD_BYTES or index < 0:
            raise ValueError(f"a round record is one line of at most {MAX_ROUND_RECORD_BYTES} "
                             f"bytes with a round >= 0 (got {len(body)} bytes, round {index})")
        line = _line(index, body)
        with self._lock:
            self._records.append(RoundLine(index, body))
            self._size += len(line)
            if len(self._records) > self.max_records or self._size > self.max_bytes:
                kept, _ = _bounded(self._records, int(self.max_records * _KEEP_FRACTION),
                                   int(self.max_bytes * _KEEP_FRACTION))
                self._records = deque(kept)
                self._rewrite()
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                         0o600)
            try:
                os.write(fd, line)  # one write with O_APPEND: a line is never interleaved
            finally:
                os.close(fd)

    def records(self, since: int | None = None) -> list[RoundLine]:
        """The kept records, oldest first; ``since``: those of rounds >= it only."""
        with self._lock:
            return [r for r in self._records if since is None or r.round >= since]
