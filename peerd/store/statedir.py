"""A node's state directory: a blob store, the node's counters and an append-only audit log.

Every file here is a state file (peerd.store.statefile): written atomically, so a crash or
power cut leaves either the old file or the new one, and checked on read (header with the
body's length and SHA-256), so a torn write, a truncated file or a flipped bit is detected.
This module owns what happens then: a file that fails the check is moved to ``quarantine/``
under a timestamped name, a warning is logged and the reader gets ``None``: a corrupt cache
entry costs that entry, never the node. It also owns the directory's layout and the small
cache index the offline status view reads (:func:`persisted_cache`). It must not decode
what the blobs hold (signed entry frames are peerd.store.persist's) nor touch ``node.key``.

Bodies are opaque bytes: the daemon stores signed wire frames (verified again when loaded),
never pickles. Layout of a state directory (0700, files 0600)::

    node.key            identity key (written by peerd.store.keyfile, not here)
    blobs/NAME          blob store (entry-<origin>, own.entry, manifest, cache.index,
                        ledger: peerd.store.ledgerfile, learner: peerd.store.learnerfile)
    counters.a/.b       round and version, two copies (see Counters)
    audit.log[.1-.3]    JSON lines, rotated by size
    rounds.log          the participation audit, one checksummed line per round
                        (peerd.store.roundlog; bounded, not rotated)
    quarantine/         corrupt files, kept for inspection, oldest deleted past a bound
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from peerd.store.statefile import TMP_PREFIX, Body, atomic_write, fsync_dir, read_body
from peerd.store.statefile import StateError as StateError  # what StateDir's writes raise

log = logging.getLogger(__name__)

#: Largest body accepted on read: a corrupt length field (or a file that is not ours) must
#: not make us allocate gigabytes; a 44 MB model entry is far below.
MAX_BLOB_LEN = 2 * 1024**3
#: Blob names: a flat namespace, no path separators, no leading dot (temporary files and
#: hidden files start with "."), bounded so a name always fits a file name (255 bytes).
MAX_BLOB_NAME_LEN = 200
_BLOB_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@:=+-]*$")
#: Size of the audit log before it is rotated, and how many rotated files are kept: the
#: audit log must never fill the disk the cache needs (3 × 4 MiB + the live file).
MAX_AUDIT_BYTES = 4 * 1024**2
AUDIT_KEEP = 3
#: Longest audit line: a log record with an attacker-chosen string in it stays bounded.
MAX_AUDIT_LINE = 4096
#: Most files kept in quarantine: a disk that keeps corrupting files must not fill up with
#: copies of them; the oldest are deleted first.
MAX_QUARANTINE_FILES = 64

#: Blob-name prefix of persisted cache entries (``entry-<origin>``, as peerd.store.persist writes
#: them): `peerd status --state-dir` lists these while the daemon is down.
ENTRY_BLOB_PREFIX = "entry-"
#: JSON index of the persisted cache (origin -> version, received_from, received_at), kept
#: by peerd.store.persist; read (best effort) by the offline status view.
CACHE_INDEX_BLOB = "cache.index"

_COUNTER_FILES = ("counters.a", "counters.b")


# ---------------------------------------------------------------------------- reading


def read_or_quarantine(path: Path, quarantine: Path | None,
                       max_len: int = MAX_BLOB_LEN) -> bytes | None:
    """The body at ``path``; None if missing, or if corrupt or over ``max_len`` bytes (checked
    before it is read; then it is quarantined, unless ``quarantine`` is None: a read-only
    reader only logs it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read state file %s: %s", path, exc.strerror)
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            return read_body(fh, max_len)
    except ValueError as exc:
        problem = str(exc)
    except OSError as exc:  # EIO on a failing disk: treat like corruption, never fatal
        problem = f"read error: {exc.strerror}"
    if quarantine is None:
        log.warning("corrupt state file %s (%s)", path, problem)
    else:
        _quarantine(path, quarantine, problem)
    return None


def _quarantine(path: Path, quarantine: Path, problem: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = quarantine / f"{path.name}.{stamp}"
    try:
        quarantine.mkdir(mode=0o700, exist_ok=True)
        os.replace(path, target)
    except OSError as exc:
        # Could not move it: delete it rather than trip over it on every start.
        log.warning("corrupt state file %s (%s); cannot quarantine it (%s), deleting it",
                    path, problem, exc.strerror)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    log.warning("corrupt state file %s (%s): moved to %s", path, problem, target)
    _trim_quarantine(quarantine)


def _trim_quarantine(quarantine: Path) -> None:
    try:
        files = sorted(quarantine.iterdir(), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in files[:-MAX_QUARANTINE_FILES]:
        with contextlib.suppress(OSError):
            old.unlink()


# ---------------------------------------------------------------------------- the directory


@dataclass(frozen=True, slots=True)
class Counters:
    """The node's round and (published) version counters.

    ``lost`` is True when counter files existed but none was intact: the caller must then
    not restart versions from 0 (a reused version would be rejected or shadow a newer one)
    but from a floor it knows, e.g. the highest own version seen in the cache or from peers.
    """

    round: int = 0
    version: int = 0
    lost: bool = False


#: Mode bits of the state directory that expose it (group or world write, world read): the
#: node's private key and what it trusts (manifest, ledger, entries) live in it, so a
#: directory others could read or write is warned about at start, not only tightened.
EXPOSED_DIR_BITS = 0o026


def _exposure(mode: int) -> str:
    """What ``mode`` lets others do, for the warning."""
    who = [w for bit, w in ((0o020, "group-writable"), (0o002, "world-writable"),
                            (0o004, "world-readable")) if mode & bit]
    return ", ".join(who)


class StateDir:
    """A node's state directory (created 0700). Thread-safe: the daemon writes from workers.

    ``readonly``: for readers beside a daemon that may be running (``peerd status
    --state-dir``): nothing is created, tightened, cleaned or quarantined, so a live daemon's
    temporary files (atomic writes, entries being received) are never touched.
    """

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.blobs = path / "blobs"
        self.quarantine = path / "quarantine"
        self.audit_path = path / "audit.log"
        self.readonly = readonly
        self._lock = threading.Lock()
        if readonly:
            return
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            # An existing directory may have been made by hand with a looser umask; the
            # identity key lives here, so tighten it (only works if we own it, as we should).
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode != 0o700:
                os.chmod(path, 0o700)
            if mode & EXPOSED_DIR_BITS:
                # Until now, others could have read the key or replaced state files (the
                # manifest, the ledger, cached entries): tightening it silently hid that.
                log.warning("state directory %s had mode %04o (%s): tightened to 0700; "
                            "keep it private (chmod 700 %s) and check who changed it",
                            path, mode, _exposure(mode), path)
            self.blobs.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StateError(exc.errno,
                             f"cannot use state directory {path}: {exc.strerror}") from exc
        self._clean_temp_files()

    def _clean_temp_files(self) -> None:
        # A crash between creating a temporary file and renaming it leaves it behind; it was
        # never the real file, so deleting it loses nothing.
        for directory in (self.path, self.blobs):
            for tmp in directory.glob(f"{TMP_PREFIX}*"):
                with contextlib.suppress(OSError):
                    tmp.unlink()
                    log.info("removed leftover temporary file %s", tmp)

    # --- blobs -------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.readonly:
            raise StateError(errno.EROFS, f"{self.path} was opened read-only")

    def blob_path(self, name: str) -> Path:
        """Where blob ``name`` lives (ValueError for a name that is not a plain blob name)."""
        return self._blob_path(name)

    def quarantine_file(self, path: Path, problem: str) -> None:
        """Move a corrupt state file aside (logged), as a failed read does."""
        self._check_writable()
        _quarantine(path, self.quarantine, problem)

    def _blob_path(self, name: str) -> Path:
        if len(name) > MAX_BLOB_NAME_LEN or not _BLOB_NAME.match(name):
            raise ValueError(f"bad blob name {name!r}: letters, digits and _.@:=+- only, "
                             f"not starting with '.' or '-', at most {MAX_BLOB_NAME_LEN} chars")
        return self.blobs / name

    def write_blob(self, name: str, data: Body | Sequence[Body]) -> None:
        """Store ``data`` (bytes, or parts written back to back) under ``name`` atomically
        (StateError on failure, old copy kept)."""
        self._check_writable()
        path = self._blob_path(name)
        size = (memoryview(data).nbytes if isinstance(data, Body)
                else sum(memoryview(p).nbytes for p in data))
        if size > MAX_BLOB_LEN:
            raise ValueError(f"blob {name!r} is {size} bytes, over {MAX_BLOB_LEN}")
        atomic_write(path, data)

    def read_blob(self, name: str, max_len: int = MAX_BLOB_LEN) -> bytes | None:
        """The blob, or None if absent, corrupt or over ``max_len`` bytes (such a one is
        quarantined; the size is checked before anything is read)."""
        return read_or_quarantine(self._blob_path(name),
                                  None if self.readonly else self.quarantine, max_len)

    def list_blobs(self, prefix: str = "") -> list[str]:
        """Names of stored blobs starting with ``prefix``, sorted (contents not checked)."""
        try:
            names = [p.name for p in self.blobs.iterdir()]
        except OSError as exc:
            log.warning("cannot list %s: %s", self.blobs, exc.strerror)
            return []
        return sorted(n for n in names if n.startswith(prefix) and _BLOB_NAME.match(n))

    def delete_blob(self, name: str) -> bool:
        """Remove a blob; True if it existed."""
        self._check_writable()
        try:
            self._blob_path(name).unlink()
        except FileNotFoundError:
            return False
        fsync_dir(self.blobs)
        return True

    # --- counters ----------------------------------------------------------------------

    def load_counters(self) -> Counters:
        """The highest intact counters of the two copies (zeros on a fresh directory)."""
        found: list[Counters] = []
        existed = False
        for name in _COUNTER_FILES:
            path = self.path / name
            existed = existed or path.exists()
            body = read_or_quarantine(path, None if self.readonly else self.quarantine)
            if body is None:
                continue
            try:
                raw = json.loads(body)
                c = Counters(round=int(raw["round"]), version=int(raw["version"]))
                if c.round < 0 or c.version < 0:
                    raise ValueError("negative counter")
                found.append(c)
            except (ValueError, KeyError, TypeError) as exc:
                # Intact header but nonsense inside: a bug wrote it; same treatment.
                log.warning("counter file %s holds no valid counters (%s)", path, exc)
        if not found:
            if existed:
                log.error("every copy of the round/version counters in %s is corrupt", self.path)
            return Counters(lost=existed)
        return Counters(round=max(c.round for c in found), version=max(c.version for c in found))

    def save_counters(self, counters: Counters) -> None:
        """Persist both copies, one after the other, so a crash mid-way leaves one intact."""
        self._check_writable()
        if counters.round < 0 or counters.version < 0:
            raise ValueError(f"counters must be >= 0, got {counters}")
        body = json.dumps({"round": counters.round, "version": counters.version}).encode()
        with self._lock:
            for name in _COUNTER_FILES:
                atomic_write(self.path / name, body)

    # --- audit log ---------------------------------------------------------------------

    def audit(self, event: str, **fields: Any) -> bool:
        """Append one JSON line ``{"ts", "event", ...}``; rotated by size.

        An audit failure (disk full) is logged and returns False rather than raising: the
        audit trail must not stop the node from learning.
        """
        if self.readonly:
            return False
        record = {"ts": round(time.time(), 3), "event": event, **fields}
        line = json.dumps(record, default=str, ensure_ascii=True)
        if len(line) > MAX_AUDIT_LINE:
            line = json.dumps({"ts": record["ts"], "event": event, "truncated": True,
                               "head": line[: MAX_AUDIT_LINE // 2]})
        data = (line + "\n").encode()
        with self._lock:
            try:
                self._rotate_if_needed(len(data))
                fd = os.open(self.audit_path,
                             os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, data)  # one write with O_APPEND: lines never interleave
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("cannot append to audit log %s: %s", self.audit_path, exc.strerror)
                return False
        return True

    def _rotate_if_needed(self, incoming: int) -> None:
        try:
            size = self.audit_path.stat().st_size
        except FileNotFoundError:
            return
        if size + incoming <= MAX_AUDIT_BYTES:
            return
        for i in range(AUDIT_KEEP - 1, 0, -1):
            older = self.audit_path.with_name(f"{self.audit_path.name}.{i}")
            if older.exists():
                os.replace(older, self.audit_path.with_name(f"{self.audit_path.name}.{i + 1}"))
        os.replace(self.audit_path, self.audit_path.with_name(f"{self.audit_path.name}.1"))

    def read_audit(self) -> list[dict[str, Any]]:
        """Audit records, oldest first, across rotated files (unparseable lines skipped)."""
        out: list[dict[str, Any]] = []
        names = [f"{self.audit_path.name}.{i}" for i in range(AUDIT_KEEP, 0, -1)]
        for name in [*names, self.audit_path.name]:
            try:
                text = (self.path / name).read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                with contextlib.suppress(ValueError):
                    item = json.loads(line)
                    if isinstance(item, dict):
                        out.append(item)
        return out


# ---------------------------------------------------------------------------- the cache index


@dataclass(frozen=True, slots=True)
class IndexRow:
    """Provenance of one persisted cache entry, as the cache index records it (None: not
    recorded, or not of the recorded type)."""

    version: int | None = None
    received_from: str | None = None
    received_at: float | None = None


def encode_cache_index(rows: Mapping[str, IndexRow]) -> bytes:
    """The ``cache.index`` body: JSON ``{origin: {version, received_from, received_at}}``."""
    return json.dumps({origin: {"version": r.version, "received_from": r.received_from,
                                "received_at": r.received_at}
                       for origin, r in rows.items()}).encode()


def _int(value: object) -> int | None:
    # JSON true/false decode as bool, an int subclass: not a version or a time.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_cache_index(state: StateDir) -> dict[str, IndexRow]:
    """The cache index, origin -> row; empty when absent or not an index (it only adds
    detail: the entries themselves carry what is verified)."""
    raw = state.read_blob(CACHE_INDEX_BLOB)
    try:
        index = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    if not isinstance(index, dict):
        return {}
    rows: dict[str, IndexRow] = {}
    for origin, item in index.items():
        item = item if isinstance(item, dict) else {}
        sender, at = item.get("received_from"), item.get("received_at")
        rows[origin] = IndexRow(
            version=_int(item.get("version")),
            received_from=sender if isinstance(sender, str) else None,
            received_at=at if isinstance(at, float) else _int(at))
    return rows


@dataclass(frozen=True, slots=True)
class PersistedEntry:
    """One cache entry file as the state directory holds it (not verified: the offline view)."""

    origin: str
    blob: str
    #: Size of the entry's state file in bytes.
    size: int
    version: int | None
    received_from: str | None
    received_at: float | None


def persisted_cache(state: StateDir) -> list[PersistedEntry]:
    """The entry files in ``state`` with what the cache index says about each, by blob name:
    what `peerd status --state-dir` shows while the daemon is down."""
    index = read_cache_index(state)
    out = []
    for name in state.list_blobs(ENTRY_BLOB_PREFIX):
        origin = name.removeprefix(ENTRY_BLOB_PREFIX)
        row = index.get(origin, IndexRow())
        out.append(PersistedEntry(
            origin=origin, blob=name, size=state.blob_path(name).stat().st_size,
            version=row.version, received_from=row.received_from, received_at=row.received_at))
    return out
