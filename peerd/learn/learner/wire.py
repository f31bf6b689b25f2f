"""The control messages between the daemon and its learner worker, and the tensor buffers.

**Messages** are JSON objects, each framed by its length (4 bytes, big-endian), over a pair
of pipes. JSON and never pickle: the worker runs the user's code, and nothing it writes is
ever executed or unpickled by the daemon; a frame is at most :data:`MAX_FRAME` bytes, so a
worker cannot make the daemon buffer without bound. NaN and infinities are allowed in the
JSON (Python's spelling) so that a learner's NaN loss arrives as one and is refused by name.

**Buffers** carry the parameters, never the pipes: a file laid out by the fleet's schema
(each tensor contiguous at a 64-byte aligned offset), mapped by both processes. The daemon
writes x̄ into the input buffer (one copy) and the worker maps it copy-on-write as ``params``
and ``anchor`` (no copy: a page is copied only if the learner writes it); the worker writes
its result into the output buffer (one copy), which the daemon maps and copies into its model.

The external learner's socket (:mod:`peerd.learn.learner.external`) uses the same frames
and the same buffer layout (memfds instead of files).

Imports torch and the standard library only.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import select
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from peerd.learn.learner.check import FleetSchema, Slot

#: Largest control frame: metrics and error details are small by the contract's bounds.
MAX_FRAME = 1 << 20
ALIGN = 64
_LEN = struct.Struct(">I")


class WireError(Exception):
    """The other side closed its pipe, sent a malformed frame, or did not answer in time."""


class PeerGoneError(WireError):
    """End of file: the other process closed the pipe (or died)."""


class DeadlineError(WireError):
    """No complete frame before the deadline."""


# ---------------------------------------------------------------------------- messages


#: The length prefix of a frame.
HEADER_LEN = _LEN.size


def frame(message: Mapping[str, Any]) -> bytes:
    """``message`` as one frame: its length (4 bytes, big-endian), then its JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"message of {len(body)} bytes is above {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The body length a frame's header announces (above :data:`MAX_FRAME`: WireError)."""
    (size,) = _LEN.unpack(header)
    if size > MAX_FRAME:
        raise WireError(f"a frame of {size} bytes is above {MAX_FRAME}")
    return int(size)


def parse(body: bytes) -> dict[str, Any]:
    """A frame's body as the JSON object it must be (else WireError)."""
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"a frame that is not JSON: {exc}") from None
    except RecursionError:
        raise WireError("a frame nested too deep") from None
    if not isinstance(message, dict):
        raise WireError(f"a frame that is not an object: {type(message).__name__}")
    return message


def send(fd: int, message: Mapping[str, Any]) -> None:
    data = memoryview(frame(message))
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            raise PeerGoneError("the other side closed its pipe") from None
        data = data[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    left = n
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while left:
        if deadline is not None:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not poller.poll(wait_ms):
                raise DeadlineError("no answer in time")
        try:
            chunk = os.read(fd, min(left, 1 << 16))
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise PeerGoneError(f"reading the pipe: {exc.strerror}") from None
        if not chunk:
            raise PeerGoneError("the other side closed its pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, *, deadline: float | None = None) -> dict[str, Any]:
    """The next message; ``deadline`` in :func:`time.monotonic` seconds (None: wait)."""
    size = frame_length(_read_exact(fd, HEADER_LEN, deadline))
    return parse(_read_exact(fd, size, deadline))


# ---------------------------------------------------------------------------- schema


def schema_to_json(schema: FleetSchema) -> list[list[Any]]:
    return [[name, list(s.shape), str(s.dtype).removeprefix("torch.")]
            for name, s in schema.items()]


def schema_from_json(raw: Any) -> dict[str, Slot]:
    if not isinstance(raw, list):
        raise WireError("schema: expected a list")
    out: dict[str, Slot] = {}
    for item in raw:
        try:
            name, shape, dtype_name = item
            dtype = getattr(torch, dtype_name)
        except (TypeError, ValueError, AttributeError):
            raise WireError(f"schema: bad slot {item!r:.80}") from None
        if not (isinstance(name, str) and isinstance(dtype, torch.dtype)
                and isinstance(shape, list) and all(isinstance(d, int) and d >= 0
                                                    for d in shape)):
            raise WireError(f"schema: bad slot {item!r:.80}")
        out[name] = Slot(tuple(shape), dtype)
    return out


# ---------------------------------------------------------------------------- buffers


def _nbytes(slot: Slot) -> int:
    count = 1
    for d in slot.shape:
        count *= d
    return count * torch.empty((), dtype=slot.dtype).element_size()


def layout(schema: FleetSchema) -> tuple[dict[str, int], int]:
    """Each tensor's byte offset in a buffer (64-byte aligned, schema order) and the size."""
    offsets: dict[str, int] = {}
    end = 0
    for name, slot in schema.items():
        start = -(-end // ALIGN) * ALIGN
        offsets[name] = start
        end = start + _nbytes(slot)
    return offsets, max(end, 1)  # an empty file cannot be mapped


def create_buffer(path: Path, size: int) -> None:
    """A new zero-filled buffer file, readable and writable by its owner only."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


class Buffer:
    """A buffer file mapped once and kept mapped for the learner's life, its tensors by name
    (views of the mapping, no copy).

    ``shared``: writes go to the file (the writer's side). Otherwise the mapping is private
    copy-on-write: pages nobody wrote are the file's own pages (what the other process writes
    shows through, no copy), and what a reader writes stays in its process, on pages of its
    own. :meth:`reset` drops those pages, so each call starts from the file's content again:
    the mapping (and its page tables) outlive a call, the writes of one call never do.
    Mapping anew each call instead cost a fault per page and a fresh tensor per call.
    """

    def __init__(self, path: Path, schema: FleetSchema, *, shared: bool) -> None:
        offsets, size = layout(schema)
        fd = os.open(path, os.O_RDWR)
        try:
            have = os.fstat(fd).st_size
            if have != size:
                raise WireError(f"{path.name}: {have} bytes, the schema needs {size}")
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED if shared
                                  else mmap.MAP_PRIVATE)
        finally:
            os.close(fd)  # the mapping holds the file
        self.shared = shared
        flat = torch.frombuffer(self._map, dtype=torch.uint8)
        self.tensors: dict[str, torch.Tensor] = {}
        for name, slot in schema.items():
            lo = offsets[name]
            self.tensors[name] = flat[lo:lo + _nbytes(slot)].view(slot.dtype).view(slot.shape)

    def reset(self) -> dict[str, torch.Tensor]:
        """The tensors as the file holds them now (a private mapping's own writes dropped)."""
        if not self.shared:
            # On a private file mapping MADV_DONTNEED discards the copied-on-write pages:
            # the next read faults the file's page back in (Linux semantics, by design).
            self._map.madvise(mmap.MADV_DONTNEED)
        return self.tensors


def write_into(dst: Mapping[str, torch.Tensor], src: Mapping[str, torch.Tensor],
               names: Sequence[str]) -> None:
    """Copy ``src`` into the mapped ``dst`` tensor by tensor (each moved to the CPU first,
    when a learner returns device tensors)."""
    with torch.no_grad():
        for name in names:
            dst[name].copy_(src[name].detach())
