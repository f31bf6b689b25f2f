"""The simulated exchange's entries through the wire's tensor codec (``--entry-encoding``).

A cached-DFL agent's published model is what its peers blend: with a compact encoding
(:mod:`peerd.protocol.encoding`) that is the model after the real round trip, encoded by
:func:`peerd.protocol.tensors.encode_tensors`, its index read back by ``index_from_wire``
and decoded by ``decode_tensors``, exactly as a receiving daemon does. The agent itself
keeps its float32 model (the daemon blends its own model, not its entry). The payload's
length is what one transfer of the entry costs (the signed head, a few hundred bytes, is
not counted).
"""

from __future__ import annotations

import numpy as np
import torch

from peerd.core.entry import Schema
from peerd.protocol.encoding import Encoding
from peerd.protocol.tensors import decode_tensors, encode_tensors, index_from_wire


class WireCodec:
    """Round trips of flat ``[A, D]`` model rows through one encoding of one schema."""

    def __init__(self, schema: Schema, encoding: Encoding) -> None:
        self.schema = schema
        self.encoding = encoding
        self._specs = schema.float_specs
        for s in self._specs:
            if s.dtype != "float32":
                raise ValueError(f"the simulator's models are float32; {s.name} is {s.dtype}")

    def roundtrip(self, rows: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """Each row as its receivers decode it, and each entry's payload bytes."""
        matrix = rows.detach().to(torch.float32).contiguous().numpy()
        out = np.empty_like(matrix)
        sizes: list[int] = []
        for r in range(matrix.shape[0]):
            tensors, offset = {}, 0
            for s in self._specs:
                tensors[s.name] = matrix[r, offset : offset + s.numel].reshape(s.shape)
                offset += s.numel
            index, payload = encode_tensors(tensors, encoding=self.encoding)
            received = index_from_wire([item.to_wire() for item in index], len(payload))
            decoded = decode_tensors(received, payload)
            offset = 0
            for s in self._specs:
                out[r, offset : offset + s.numel] = decoded[s.name].reshape(-1)
                offset += s.numel
            sizes.append(len(payload))
        return torch.from_numpy(out), sizes
