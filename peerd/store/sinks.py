"""Where a received frame body lands when it is not spooled to a file: memory.

The framing layer (:mod:`peerd.net.framing`) writes a frame into a sink as its bytes arrive;
the store decides where those bytes live. :class:`peerd.store.spool.SpoolWriter` puts an
entry in a state file (and falls back to this sink when the disk is full); every other frame
comes here. It lives in the store, not in net, so the spool can use it without the store
importing the network stage (the stage order of docs/architecture.md).

No torch, no trio: the network stage imports it on every read.
"""

from __future__ import annotations

import mmap


class MemorySink:
    """A frame body in its own anonymous ``mmap`` of exactly its length: pages are committed
    only as bytes land in them, and all of it goes back to the OS with the last view."""

    def __init__(self) -> None:
        self._buf: mmap.mmap | None = None
        self._filled = 0

    def begin(self, length: int) -> None:
        self._buf = mmap.mmap(-1, max(1, length))
        self._length, self._filled = length, 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self._buf is not None
        end = self._filled + len(data)
        if end > self._length:
            raise ValueError("more bytes than the frame announced")
        self._buf[self._filled : end] = data
        self._filled = end

    def finish(self) -> memoryview:
        assert self._buf is not None
        return memoryview(self._buf)[: self._length]

    def abort(self) -> None:
        self._buf = None
