"""What the node stage needs of an entry kept in a mapped state file, as a Protocol.

The file itself is the store's (:class:`peerd.store.spool.MappedFrame` is the one
implementation: it opens, maps, renames and fsyncs). The node only reads it, hashes it and
hands its pages back; the net stage sends it piece by piece and the store commits it, all
through :attr:`peerd.node.state.Held.frame`. Declaring the interface here, below the store,
keeps the stage order (docs/architecture.md): the store imports the node, never the reverse.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import torch


class EntryFile(Protocol):
    """One frame body in a read-only mapped state file."""

    @property
    def body(self) -> memoryview:
        """The frame body, read-only (an entry's payload is its tail)."""
        ...

    @property
    def path(self) -> Path: ...

    @property
    def committed(self) -> bool:
        """False for a just-received frame in a temporary file, True once durable."""
        ...

    def release(self, start: int = 0, end: int | None = None) -> None:
        """Hand the pages of ``body[start:end]`` back to the kernel (they fault back in)."""
        ...

    def pieces(self, start: int, end: int) -> Iterator[tuple[int, memoryview]]:
        """``(offset, view)`` pieces of ``body[start:end]``, each small enough to release."""
        ...

    def sha256_tail(self, view: memoryview | bytes | bytearray) -> str:
        """SHA-256 (hex) of ``view``, a tail of :attr:`body`, releasing pages as it reads."""
        ...

    def paged(self, tensors: Mapping[str, torch.Tensor],
              ranges: Mapping[str, tuple[int, int]]) -> Mapping[str, torch.Tensor]:
        """``tensors`` (views into :attr:`body`; ``ranges``: name -> its byte range) as a
        mapping that releases one tensor's pages when the next is read."""
        ...

    def commit(self, path: Path) -> None:
        """Make a received frame durable as ``path``."""
        ...
