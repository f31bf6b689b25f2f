"""An encoded entry's tensors read from its mapped state file (``[fleet] entry_encoding``).

A raw entry's tensors are views of the file (``EntryFile.paged``); an encoded tensor
(:mod:`peerd.protocol.encoding`) has no float32 bytes there to view, so it is decoded from
the file each time it is read and the encoded bytes' pages are handed back. Its readers (the
validation, the blend, the drift) go tensor by tensor, so a cached encoded entry keeps about
one float32 tensor resident while it is read, and none between rounds.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence

import torch

from peerd.node.entryfile import EntryFile
from peerd.protocol.encoding import decode_array
from peerd.protocol.tensors import TensorIndexItem


class DecodedParams(Mapping[str, torch.Tensor]):
    """A mapped entry's tensors where some are encoded (peerd.protocol.encoding): those are
    decoded from the file's bytes each time they are read, and the bytes' pages let go, so a
    cached encoded entry holds no float32 copy of itself between rounds (its readers, the
    validation, blend and drift, go tensor by tensor); raw tensors are ``paged``'s views."""

    def __init__(self, index: Sequence[TensorIndexItem], frame: EntryFile, base: int,
                 raw: Mapping[str, torch.Tensor]) -> None:
        self._items = {i.name: i for i in index}
        self._frame, self._base, self._raw = frame, base, raw

    def __getitem__(self, name: str) -> torch.Tensor:
        item = self._items[name]
        if item.codec is None:
            return self._raw[name]
        start = self._base + item.offset
        data = self._frame.body[start : start + item.nbytes]
        # Verified at admission (digest and codec checks): decoding again cannot fail.
        values = decode_array(item.codec, item.block, item.shape, data, name)
        self._frame.release(start, start + item.nbytes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only: never written
            return torch.from_numpy(values)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
