"""Model-cache entries, their schema, and the flat float32 layout every blend works on.

An entry is what an origin vouches for (and signs): who made it, which of its rounds, when by
its own clock, for which architecture, from how many examples, and the tensors. Where it came
from second-hand (``received_from``/``received_at``) is provenance, kept *beside* the entry in
:class:`CacheItem` because a relay must not be able to alter what the origin signed.

The core's view of an entry only: it never signs or encodes one (``peerd.protocol.entry``
does, over the same tensor bytes that :func:`payload_digest` hashes).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

#: dtypes a model may hold. Floating ones are blended; integer/bool buffers (e.g. BatchNorm's
#: ``num_batches_tracked``) are carried but never averaged: a weighted mean of counters is noise.
FLOAT_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.float32, torch.float16, torch.bfloat16, torch.float64}
)
ALLOWED_DTYPES: frozenset[torch.dtype] = FLOAT_DTYPES | frozenset(
    {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
)


def dtype_name(dtype: torch.dtype) -> str:
    """Torch's short dtype name (``"float32"``), the spelling used on the wire and in schemas."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Schema:
    """Names, dtypes and shapes of a model's tensors, in sorted-name order.

    Sorted order is the canonical order everywhere (schema id, payload digest, flat layout,
    wire payload) so two nodes with the same architecture agree byte for byte.
    """

    specs: tuple[TensorSpec, ...]

    @classmethod
    def of(cls, params: Mapping[str, torch.Tensor]) -> Schema:
        specs = []
        for name in sorted(params):
            t = params[name]
            if t.dtype not in ALLOWED_DTYPES:
                raise ValueError(f"tensor {name!r} has unsupported dtype {t.dtype}")
            specs.append(TensorSpec(name, dtype_name(t.dtype), tuple(t.shape)))
        return cls(tuple(specs))

    @property
    def id(self) -> str:
        """SHA-256 over the canonical ``name:dtype:shape`` lines (hex, 64 chars)."""
        h = hashlib.sha256(b"peerd/schema/v1\0")
        for s in self.specs:
            h.update(f"{s.name}:{s.dtype}:{','.join(map(str, s.shape))}\n".encode())
        return h.hexdigest()

    @property
    def float_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.specs if s.dtype in _FLOAT_NAMES)

    @property
    def flat_size(self) -> int:
        """Number of float32 slots in the flat vector (floating tensors only)."""
        return sum(s.numel for s in self.float_specs)


_FLOAT_NAMES = frozenset(dtype_name(d) for d in FLOAT_DTYPES)


def payload_digest(params: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 (hex) of the tensors' raw little-endian bytes in sorted-name order.

    Identical to the wire payload hash (``peerd.protocol`` packs the same bytes in the same
    order), so equivocation — one origin, one version, two payloads — is detectable anywhere.
    """
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach().contiguous().cpu()
        # bfloat16 has no numpy dtype: view the same 2-byte words as int16 to get raw bytes.
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(t.numpy().data)  # contiguous: hashes the buffer without a copy
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """What an origin vouches for, minus the tensors. Enough to merge caches without payloads."""

    origin: str
    version: int  # the origin's own strictly increasing counter (its round)
    created_at: float  # UNIX seconds by the origin's clock
    schema_id: str
    num_examples: int
    digest: str  # payload_digest of the tensors
    #: What the entry carries (peerd.protocol.kinds): "weights" (a model), "knowledge" (per-
    #: sample logits; num_examples is then its sample count) or "keys". Signed by the origin.
    kind: str = "weights"
    #: The origin's cache group (its ``[learning] group``), signed with the rest; None: the
    #: origin names none. Only :func:`peerd.core.cache.merge`'s per-group quota reads it.
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    meta: EntryMeta
    params: Mapping[str, torch.Tensor] = field(repr=False)

    @classmethod
    def create(
        cls,
        *,
        origin: str,
        version: int,
        created_at: float,
        num_examples: int,
        params: Mapping[str, torch.Tensor],
    ) -> Entry:
        """Stamp local tensors as an entry (schema id and digest computed here)."""
        detached = {k: v.detach() for k, v in params.items()}
        meta = EntryMeta(
            origin=origin,
            version=version,
            created_at=created_at,
            schema_id=Schema.of(detached).id,
            num_examples=num_examples,
            digest=payload_digest(detached),
        )
        return cls(meta, detached)


@dataclass(frozen=True, slots=True)
class CacheItem:
    """An entry as held in a cache, with provenance the origin did not sign.

    ``entry`` is generic on purpose (anything with ``.meta``): the daemon stores full
    :class:`Entry` objects, the simulator lightweight handles to rows of a shared matrix.
    """

    meta: EntryMeta
    received_from: str | None  # the peer that handed it to us (None: our own)
    received_at: float  # our clock (time mode) or our round (round mode)
    payload: object = field(default=None, repr=False, compare=False)
    verified: bool = True


def flatten(
    params: Mapping[str, torch.Tensor], schema: Schema, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Pack the floating tensors into one float32 vector in schema order (one copy)."""
    n = schema.flat_size
    if out is None:
        out = torch.empty(n, dtype=torch.float32)
    elif out.shape != (n,) or out.dtype != torch.float32:
        raise ValueError(f"out must be float32[{n}], got {out.dtype}{list(out.shape)}")
    offset = 0
    for s in schema.float_specs:
        t = params[s.name]
        if tuple(t.shape) != s.shape:
            raise ValueError(f"tensor {s.name!r}: shape {tuple(t.shape)} != schema {s.shape}")
        out[offset : offset + s.numel].copy_(t.detach().reshape(-1))
        offset += s.numel
    return out


def unflatten(
    vec: torch.Tensor, schema: Schema, extras: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`flatten`. Non-floating tensors come from ``extras`` (e.g. own model).

    float32 tensors are views into ``vec`` (no copy); other float dtypes are cast back.
    """
    if vec.shape != (schema.flat_size,):
        raise ValueError(f"flat vector has {vec.numel()} values, schema needs {schema.flat_size}")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for s in schema.specs:
        if s.dtype in _FLOAT_NAMES:
            view = vec[offset : offset + s.numel].view(s.shape)
            offset += s.numel
            dtype = getattr(torch, s.dtype)
            out[s.name] = view if dtype == torch.float32 else view.to(dtype)
        else:
            if extras is None or s.name not in extras:
                raise ValueError(f"non-floating tensor {s.name!r} needs a value from extras")
            out[s.name] = extras[s.name]
    return out
