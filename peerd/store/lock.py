"""The state directory's lock: one daemon per state directory, for the daemon's lifetime.

``peerd run`` takes an exclusive ``flock(2)`` on ``<state_dir>/peerd.lock`` before it reads
any state, and holds it until the process exits (the kernel drops it then, also after a
crash or SIGKILL: there is no stale lock to clean up). A second daemon on the same directory
fails at once with "already running (pid N)", before it has restored, quarantined or
overwritten anything the first one owns.

The file holds the holder's pid and control socket as JSON, so ``peerd status --state-dir``
can ask *that* node's daemon (:func:`holder`) and never another's. The content is a hint
for readers; the lock itself is the kernel's. Owns only this file: it must not read or write
anything else in the state directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

#: File name of the lock inside a state directory.
LOCK_FILE = "peerd.lock"
#: Largest lock file read: it holds a pid and a socket path (< 200 bytes).
MAX_LOCK_FILE_LEN = 4096
#: Tries (and the pause between them) before a held lock means "already running": a
#: reader's probe (:func:`holder`) holds a shared lock for microseconds, never longer.
_LOCK_TRIES = 5
_LOCK_PAUSE_S = 0.02


class StateLockError(Exception):
    """The state directory is locked by a running daemon, or cannot be locked at all."""


@dataclass(frozen=True, slots=True)
class LockHolder:
    """What the running daemon wrote into the lock file (fields None when unreadable)."""

    pid: int | None
    socket: Path | None


class StateLock:
    """An exclusive lock on a state directory, held until :meth:`release` or process exit."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> StateLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(state_dir: Path, *, socket: Path | None = None) -> StateLock:
    """Lock ``state_dir`` (created 0700 if missing) for this process, and record our pid and
    control ``socket`` in the lock file; :class:`StateLockError` when another process holds
    it ("already running (pid N)") or the directory cannot be used."""
    path = state_dir / LOCK_FILE
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # No O_TRUNC: the holder's record must survive our failed attempt.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StateLockError(f"cannot use state directory {state_dir}: "
                             f"{exc.strerror or exc}") from None
    try:
        _lock(fd, path)
        record = json.dumps({"pid": os.getpid(),
                             "socket": None if socket is None else str(socket.absolute())})
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode() + b"\n", 0)
    except BaseException:
        os.close(fd)
        raise
    return StateLock(path, fd)


def _lock(fd: int, path: Path) -> None:
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StateLockError(f"cannot lock {path}: {exc.strerror}") from None
        if attempt + 1 < _LOCK_TRIES:
            time.sleep(_LOCK_PAUSE_S)
    pid = _read_record(fd).pid
    who = f"pid {pid}" if pid is not None else "pid unknown"
    raise StateLockError(f"already running ({who}): another peerd holds {path.parent}; "
                         "give each daemon its own --state-dir")


def holder(state_dir: Path) -> LockHolder | None:
    """The daemon holding ``state_dir``'s lock now, or None when none does (or no lock file
    exists). Read-only: a shared lock is tried for an instant and nothing is written."""
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return _read_record(fd)
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_record(fd: int) -> LockHolder:
    try:
        data = json.loads(os.pread(fd, MAX_LOCK_FILE_LEN, 0))
    except (OSError, ValueError):
        return LockHolder(None, None)
    pid = data.get("pid") if isinstance(data, dict) else None
    sock = data.get("socket") if isinstance(data, dict) else None
    return LockHolder(pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                      Path(sock) if isinstance(sock, str) and sock and "\0" not in sock
                      else None)
