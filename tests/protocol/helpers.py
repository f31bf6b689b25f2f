"""Fixed keys, a small fleet and entry builders shared by the protocol tests."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.entry import sign_entry
from peerd.protocol.identity import node_id_of, private_key_from_seed, public_key_bytes
from peerd.protocol.ledger import LedgerView, OriginLedger
from peerd.protocol.manifest import Manifest
from peerd.protocol.messages import Entry

FLEET = bytes(range(16))
OTHER_FLEET = bytes(range(1, 17))
NOW = 1_700_000_000.0
SCHEMA_ID = hashlib.sha256(b"test-schema").hexdigest()


def key(label: str) -> Ed25519PrivateKey:
    return private_key_from_seed(hashlib.sha256(label.encode()).digest())


ALICE = key("alice")
BOB = key("bob")
MALLORY = key("mallory")  # never admitted
ADMIN = key("admin")


def tensors(scale: float = 1.0) -> dict[str, npt.NDArray[Any]]:
    return {
        "fc.weight": (np.arange(12, dtype=np.float32).reshape(3, 4) * scale),
        "fc.bias": np.full(3, 0.5 * scale, dtype=np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
    }


SCHEMA = {name: (str(a.dtype), tuple(a.shape)) for name, a in tensors().items()}


def manifest(**not_after: float) -> Manifest:
    m = Manifest(fleet_id=FLEET, seq=1)
    for k in (ALICE, BOB):
        m = m.admit(public_key_bytes(k), not_after.get(node_id_of(k)))
    return m


def entry(
    signer: Ed25519PrivateKey = ALICE,
    *,
    version: int = 1,
    created_at: float = NOW,
    fleet: bytes = FLEET,
    scale: float = 1.0,
    arrays: dict[str, npt.NDArray[Any]] | None = None,
) -> Entry:
    return sign_entry(
        signer,
        fleet,
        version=version,
        created_at=created_at,
        schema_id=SCHEMA_ID,
        num_examples=10,
        tensors=arrays if arrays is not None else tensors(scale),
    ).to_message()


def admit_kwargs(ledger: OriginLedger | LedgerView | None = None, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "fleet_id": FLEET,
        "manifest": manifest(),
        "ledger": OriginLedger() if ledger is None else ledger,
        "schema": SCHEMA,
        "now": NOW,
    }
    base.update(kw)
    return base


def surviving_bit_flips(frame: bytes, pipeline: Callable[[bytes], object]) -> list[int]:
    """Every bit position whose flip ``pipeline`` (decode → verify → admit) does not refuse
    with a ProtocolError: exhaustive over len(frame) * 8 positions, not a sample."""
    from peerd.protocol.errors import ProtocolError

    survivors = []
    for bit in range(len(frame) * 8):
        data = bytearray(frame)
        data[bit // 8] ^= 1 << (bit % 8)
        try:
            pipeline(bytes(data))
        except ProtocolError:
            continue
        survivors.append(bit)
    return survivors
