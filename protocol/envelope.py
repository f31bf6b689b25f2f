"""Signed envelopes: ``{v, fleet, key, body, sig}`` with domain-separated Ed25519 signatures.

``sig = Ed25519(key, domain || fleet_id || body)``. The domain tag makes an entry signature
worthless as a manifest signature (and vice versa); the fleet id makes it worthless in any
other fleet. ``body`` is an opaque msgpack byte string: it is verified exactly as received
and only decoded afterwards, so nothing is ever re-encoded to be verified.

``fleet`` travels in clear beside the body so that an envelope for another fleet is
reported as ``WRONG_FLEET`` rather than as a bad signature; it is not trusted on its own
(the signature is checked with *our* fleet id, and the body repeats it).

Never decodes a body: entries and manifests parse their own, after :meth:`verify`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError, UnknownVersionError, VersionTooOldError
from peerd.protocol.identity import public_key_bytes, verify_signature
from peerd.protocol.limits import (
    FLEET_ID_LEN,
    MAX_BIN_LEN,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    PUBLIC_KEY_LEN,
    SIGNATURE_LEN,
)
from peerd.protocol.wire import Fields, as_bytes, as_int

#: Domain tags; the trailing NUL ends the tag so no tag is a prefix of another's input.
ENTRY_DOMAIN = b"peerd/entry/v1\0"
MANIFEST_DOMAIN = b"peerd/manifest/v1\0"

_KEYS = frozenset({"v", "fleet", "key", "body", "sig"})


def check_version(version: int) -> int:
    """Distinct errors for a peer that is too old and one that is newer than us."""
    if version < MIN_PROTOCOL_VERSION:
        raise VersionTooOldError(version, MIN_PROTOCOL_VERSION)
    if version > PROTOCOL_VERSION:
        raise UnknownVersionError(version, PROTOCOL_VERSION)
    return version


def signing_input(domain: bytes, fleet_id: bytes, body: bytes) -> bytes:
    if len(fleet_id) != FLEET_ID_LEN:
        raise ValueError(f"fleet id must be {FLEET_ID_LEN} bytes")
    return domain + fleet_id + body


@dataclass(frozen=True, slots=True)
class SignedEnvelope:
    fleet_id: bytes
    key: bytes
    body: bytes
    sig: bytes
    version: int = PROTOCOL_VERSION

    @classmethod
    def sign(
        cls, private_key: Ed25519PrivateKey, domain: bytes, fleet_id: bytes, body: bytes
    ) -> SignedEnvelope:
        sig = private_key.sign(signing_input(domain, fleet_id, body))
        return cls(fleet_id=fleet_id, key=public_key_bytes(private_key), body=body, sig=sig)

    def to_wire(self) -> dict[str, Any]:
        return {
            "v": self.version,
            "fleet": self.fleet_id,
            "key": self.key,
            "body": self.body,
            "sig": self.sig,
        }

    @classmethod
    def from_wire(cls, obj: Any) -> SignedEnvelope:
        f = Fields(obj, "envelope", _KEYS)
        version = check_version(f.get("v", as_int))
        return cls(
            version=version,
            fleet_id=f.get("fleet", as_bytes, FLEET_ID_LEN),
            key=f.get("key", as_bytes, PUBLIC_KEY_LEN),
            body=f.get("body", as_bytes, None, MAX_BIN_LEN),
            sig=f.get("sig", as_bytes, SIGNATURE_LEN),
        )

    def verify(self, domain: bytes, fleet_id: bytes, expected_key: bytes | None = None) -> bytes:
        """Check fleet, signer and signature; return the (still undecoded) body bytes."""
        if self.fleet_id != fleet_id:
            raise ProtocolError(Reason.WRONG_FLEET, f"envelope for fleet {self.fleet_id.hex()}")
        if expected_key is not None and self.key != expected_key:
            raise ProtocolError(Reason.BAD_SIGNATURE, "envelope signed by an unexpected key")
        verify_signature(self.key, self.sig, signing_input(domain, fleet_id, self.body))
        return self.body
