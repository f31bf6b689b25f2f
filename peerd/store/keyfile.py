"""Private key files and atomic, mode-0600-from-birth file writes.

Key file format: unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``) holding the
Ed25519 key, so ``openssl pkey -in node.key -noout -text`` can inspect it. The file is
created with mode 0600 by ``os.open`` (never chmod-ed afterwards: there is no window in which
another user could open it), written to a temporary name in the same directory, fsync-ed,
renamed into place and the directory fsync-ed, so a crash leaves either no key or a
complete one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

#: File name of a node's key inside its state directory.
NODE_KEY_FILE = "node.key"
#: Largest key file we read: a PEM Ed25519 key is ~120 bytes; refuse to slurp a huge file.
MAX_KEY_FILE_LEN = 4096


class KeyFileError(Exception):
    """A key file that is missing, unreadable, too permissive or not an Ed25519 key."""


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, overwrite: bool = False) -> None:
    """Write ``data`` to ``path`` atomically; the file never exists with wider permissions.

    Without ``overwrite`` an existing ``path`` is left untouched (``FileExistsError``), and
    the check is race-free because the final step is ``link``, which refuses to replace.
    """
    directory = path.parent
    tmp = directory / f".{path.name}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def encode_private_key(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def write_private_key(path: Path, key: Ed25519PrivateKey, *, overwrite: bool = False) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, encode_private_key(key), mode=0o600, overwrite=overwrite)


def read_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an Ed25519 key, refusing files other users could read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise KeyFileError(f"cannot open key file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path} is not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; a private key must be 0600"
            )
        data = fh.read(MAX_KEY_FILE_LEN + 1)
    if len(data) > MAX_KEY_FILE_LEN:
        raise KeyFileError(f"{path} is too large to be an Ed25519 key file")
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key
