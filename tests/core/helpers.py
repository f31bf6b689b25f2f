"""Small builders shared by the core tests."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.plan import BlendPlan
from peerd.core.round import Anchor

SCHEMA = "ab" * 32


def meta(
    origin: str,
    version: int,
    *,
    created_at: float | None = None,
    digest: str | None = None,
    examples: int = 100,
) -> EntryMeta:
    return EntryMeta(
        origin=origin,
        version=version,
        created_at=float(version) if created_at is None else created_at,
        schema_id=SCHEMA,
        num_examples=examples,
        digest=digest or hashlib.sha256(f"{origin}@{version}".encode()).hexdigest(),
    )


def item(
    origin: str,
    version: int,
    *,
    sender: str | None = "peer",
    at: float = 0.0,
    created_at: float | None = None,
    digest: str | None = None,
) -> CacheItem:
    return CacheItem(
        meta(origin, version, created_at=created_at, digest=digest),
        received_from=sender,
        received_at=at,
    )


@dataclass
class PlainOps:
    """Round ops with only the plain steps, recording the order they were called in: a
    round with another local policy must refuse them rather than fall back to plain."""

    calls: list[str] = field(default_factory=list)

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        self.calls.append("blend")

    def train(self, anchors: Sequence[Anchor]) -> str:
        self.calls.append("train")
        return "trained"
