"""Tensors to and from the protocol's arrays: the torch side of ``peerd.protocol.tensors``.

The protocol describes payloads as named numpy arrays with a dtype and shape and knows no
torch; learners, the store and the cache hold ``torch.Tensor``. These three functions are the
only crossing, kept apart from :mod:`peerd.node.state` because exporters and learner state
(``peerd.learn``) need the conversion without a node's gossip state. Both directions are
views, never copies: an entry's arrays may be 44 MB, and a received entry is never written
(blends read it into a fresh matrix), so sharing the buffer is safe and the copy would not be.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from peerd.core.entry import Schema
from peerd.protocol.tensors import TensorIndexItem


def wire_schema(schema: Schema) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The protocol's view of a local schema: name -> (dtype, shape)."""
    return {s.name: (s.dtype, s.shape) for s in schema.specs}


def to_wire_arrays(params: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], frozenset[str]]:
    """Numpy views of (already snapshotted) tensors; bfloat16 travels as its raw uint16 words."""
    arrays: dict[str, npt.NDArray[Any]] = {}
    bf16 = set()
    for name, t in params.items():
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            arrays[name] = t.view(torch.int16).numpy().view(np.uint16)
            bf16.add(name)
        else:
            arrays[name] = t.numpy()
    return arrays, frozenset(bf16)


def from_wire_arrays(
    index: Sequence[TensorIndexItem], arrays: Mapping[str, npt.NDArray[Any]]
) -> dict[str, torch.Tensor]:
    """Torch views of verified payload arrays (no copy).

    The arrays may be read-only views of the received buffer; torch warns about that because
    writes would be undefined. Received tensors are never written: blends read them into a
    fresh matrix.
    """
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for item in index:
            t = torch.from_numpy(arrays[item.name])
            out[item.name] = t.view(torch.bfloat16) if item.dtype == "bfloat16" else t
    return out
