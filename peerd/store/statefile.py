"""One file on disk, written so that a crash leaves the old copy or the new one, never a mix.

Owns the state-file format (header: magic, format version, reserved flags, body length,
SHA-256 of the body; then the body), its checks on read, and the one atomic write that
peerd's files go through: a temporary file in the same directory (created with its final
mode, so never wider, and set to exactly that mode before a byte is written), write, fsync,
rename (or link, which refuses to replace), fsync the directory. Key files, fleet files and
configs use the plain write (:func:`atomic_write_raw`); state files add the header
(:func:`atomic_write`). (The audit log appends and received entries are spooled: see
peerd.store.statedir and peerd.store.spool, which use the header and fsync from here.)

It must not know what a file holds (blobs, counters, keys, manifests: their modules) nor
where it lives or what to do with a corrupt one (peerd.store.statedir quarantines). The
on-disk format is fixed: existing state directories must keep loading.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

MAGIC = b"PEERDST\x00"
FORMAT_VERSION = 1
#: magic, format version, reserved flags, body length, SHA-256 of the body.
_HEADER = struct.Struct(">8sHHQ32s")
HEADER_LEN = _HEADER.size

#: Temporary files (atomic writes, entries being received) start with this; whatever a crash
#: leaves behind is deleted when a state directory is next opened.
TMP_PREFIX = ".tmp-"

#: What a body may be given as: written where it lies, never joined into one more copy.
Body = bytes | bytearray | memoryview


class StateError(OSError):
    """A state write failed (disk full, permissions); the previous copy of the file is intact."""


# ---------------------------------------------------------------------------- the format


def pack_header(length: int, digest: bytes) -> bytes:
    """The header of a file whose body is ``length`` bytes with SHA-256 ``digest``."""
    return _HEADER.pack(MAGIC, FORMAT_VERSION, 0, length, digest)


def parse_header(data: bytes | memoryview, file_len: int) -> bytes:
    """Check the header at the start of ``data`` against the file's length; the body's
    SHA-256 as recorded. ValueError (with the reason) when it is not intact."""
    if file_len < HEADER_LEN:
        raise ValueError(f"shorter than the {HEADER_LEN}-byte header ({file_len} bytes)")
    magic, version, _flags, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("bad magic: not a peerd state file")
    if version != FORMAT_VERSION:
        raise ValueError(f"unknown format version {version}")
    if file_len - HEADER_LEN != length:
        have = file_len - HEADER_LEN
        raise ValueError(f"torn: header says {length} body bytes, file has {have}")
    return bytes(digest)


def encode(body: bytes) -> bytes:
    """Header + body, as stored on disk."""
    return pack_header(len(body), hashlib.sha256(body).digest()) + body


def decode(data: bytes) -> bytes:
    """The body of a stored file; ValueError (with the reason) when it is not intact."""
    digest = parse_header(data, len(data))
    body = data[HEADER_LEN:]
    if hashlib.sha256(body).digest() != digest:
        raise ValueError("SHA-256 mismatch: the body is corrupt")
    return body


def read_body(fh: BinaryIO, max_body_len: int) -> bytes:
    """The checked body of the open state file ``fh``.

    ValueError (with the reason) when it is not a regular file, is larger than a
    ``max_body_len`` body (a corrupt length or a file that is not ours must not make us
    allocate gigabytes), or fails the header or hash check; OSError when reading fails.
    """
    st = os.fstat(fh.fileno())
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > max_body_len + HEADER_LEN:
        raise ValueError(f"{st.st_size} bytes, over the {max_body_len}-byte limit")
    return decode(fh.read())


# ---------------------------------------------------------------------------- writing


def fsync_dir(directory: Path) -> None:
    """Make a rename (or unlink) in ``directory`` durable: it is only once the directory
    entry is on disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parts(data: Body | Sequence[Body]) -> list[memoryview]:
    views = [memoryview(data)] if isinstance(data, Body) else [memoryview(p) for p in data]
    return [v.cast("B") for v in views]


def _write_new(path: Path, parts: Sequence[memoryview], *, mode: int, overwrite: bool) -> None:
    """Temporary file (``mode`` from birth), write, fsync, rename or link, fsync directory.

    Raises OSError; the temporary file is gone and ``path`` untouched unless it was
    replaced as a whole (``FileExistsError`` when it exists and ``overwrite`` is false).
    """
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            # Exactly ``mode``: the umask may have narrowed it at birth (never widened), and
            # a public file (a manifest for the service user) must stay readable.
            os.fchmod(fd, mode)
            for part in parts:
                while part:
                    written = os.write(fd, part)
                    part = part[written:]
            os.fsync(fd)  # the data first, then the name: a crash never leaves a torn file
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, path)
        else:
            # link refuses to replace: the "does it exist?" check cannot race another writer.
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_raw(path: Path, data: Body | Sequence[Body], *, mode: int = 0o600,
                     overwrite: bool = False) -> None:
    """Write ``data`` (no header) to ``path`` atomically, with exactly ``mode``; the file
    never exists with wider permissions.

    Without ``overwrite`` an existing ``path`` is left untouched (``FileExistsError``).
    Raises OSError; for key files, fleet files and configs, read by other programs too.
    """
    _write_new(path, _parts(data), mode=mode, overwrite=overwrite)


def atomic_write(path: Path, body: Body | Sequence[Body]) -> None:
    """Store ``body`` (with header) at ``path`` atomically, mode 0600, replacing it.

    ``body`` may be a sequence of parts, written back to back: a 44 MB entry is then hashed
    and written where it lies instead of being joined into one more copy first.
    Raises :class:`StateError` on any OS error (ENOSPC included); the old file is untouched
    and the temporary file removed.
    """
    parts = _parts(body)
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    length = sum(part.nbytes for part in parts)
    header = memoryview(pack_header(length, digest.digest()))
    try:
        _write_new(path, [header, *parts], mode=0o600, overwrite=True)
    except OSError as exc:
        hint = " (disk full)" if exc.errno == errno.ENOSPC else ""
        raise StateError(exc.errno, f"cannot write {path}: {exc.strerror}{hint}; "
                                    "the previous copy is intact") from exc
