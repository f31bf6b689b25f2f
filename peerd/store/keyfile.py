"""Private key files: a node's identity key (``node.key``) and the fleet admin's key.

Owns the key file format: unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``) holding
the Ed25519 key, so ``openssl pkey -in node.key -noout -text`` can inspect it, and the rules
for reading one (mode 0600, a regular file, a bounded size). The write goes through
peerd.store.statefile's atomic write: created 0600 from birth (never chmod-ed: there is no
window in which another user could open it), fsync-ed, linked or renamed into place and the
directory fsync-ed, so a crash leaves either no key or a complete one. It must not do its
own file writing, nor know where a state or fleet directory keeps other files.
"""

from __future__ import annotations

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

from peerd.store.statefile import atomic_write_raw

#: File name of a node's key inside its state directory.
NODE_KEY_FILE = "node.key"
#: Largest key file we read: a PEM Ed25519 key is ~120 bytes; refuse to slurp a huge file.
MAX_KEY_FILE_LEN = 4096


class KeyFileError(Exception):
    """A key file that is missing, unreadable, too permissive or not an Ed25519 key."""


def encode_private_key(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def write_private_key(path: Path, key: Ed25519PrivateKey, *, overwrite: bool = False) -> None:
    """Write ``key`` to ``path`` (mode 0600; its directory made 0700 if missing).

    Without ``overwrite`` an existing file is left untouched (``FileExistsError``, race-free);
    OSError otherwise.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_raw(path, encode_private_key(key), mode=0o600, overwrite=overwrite)


def new_node_key(state_dir: Path, *, overwrite: bool = False) -> Ed25519PrivateKey:
    """A fresh identity key, written to ``state_dir/node.key`` (see :func:`write_private_key`)."""
    key = Ed25519PrivateKey.generate()
    write_private_key(state_dir / NODE_KEY_FILE, key, overwrite=overwrite)
    return key


def read_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an Ed25519 key, refusing files other users could read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise KeyFileError(f"cannot open key file {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a directory itself
        os.close(fd)
        raise KeyFileError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
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
