"""Small builders shared by the core tests."""

from __future__ import annotations

import hashlib

from peerd.core.entry import CacheItem, EntryMeta

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
