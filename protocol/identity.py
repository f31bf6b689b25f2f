"""Node identity: Ed25519 keys and their libp2p peer ids (``12D3KooW...``).

A node id is the libp2p peer id of the node's Ed25519 key: base58btc of the identity
multihash ``0x00 <len>`` wrapping the protobuf ``PublicKey {1: Ed25519 (=1), 2: key}``.
Because the multihash is the identity function, the public key is recoverable from the id;
envelopes carry the key anyway and we check that it matches the id they claim.

Never generates, reads or stores a key: that is ``peerd.store`` (``keyfile``, ``fleetdir``).
"""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import MAX_NODE_ID_LEN, PUBLIC_KEY_LEN, SIGNATURE_LEN
from peerd.protocol.wire import as_str

_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}

#: protobuf PublicKey{Type=Ed25519(1), Data=<32 bytes>}: field 1 varint (0x08 0x01),
#: field 2 length-delimited (0x12 0x20).
_PROTOBUF_ED25519_PREFIX = b"\x08\x01\x12\x20"
#: identity multihash (code 0x00) of the 36-byte protobuf encoding.
_MULTIHASH_PREFIX = b"\x00\x24"
_PEER_ID_PREFIX = _MULTIHASH_PREFIX + _PROTOBUF_ED25519_PREFIX
_PEER_ID_BYTES = len(_PEER_ID_PREFIX) + PUBLIC_KEY_LEN


def b58encode(data: bytes) -> str:
    num = int.from_bytes(data, "big")
    chars: list[str] = []
    while num:
        num, rem = divmod(num, 58)
        chars.append(_B58_ALPHABET[rem])
    zeros = len(data) - len(data.lstrip(b"\x00"))
    return "1" * zeros + "".join(reversed(chars))


def b58decode(text: str) -> bytes:
    num = 0
    for ch in text:
        digit = _B58_INDEX.get(ch)
        if digit is None:
            raise ValueError(f"invalid base58 character {ch!r}")
        num = num * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    body = num.to_bytes((num.bit_length() + 7) // 8, "big") if num else b""
    return b"\x00" * zeros + body


def node_id_from_public_key(pub: bytes) -> str:
    """libp2p peer id of a raw 32-byte Ed25519 public key."""
    if len(pub) != PUBLIC_KEY_LEN:
        raise ValueError(f"Ed25519 public key must be {PUBLIC_KEY_LEN} bytes, got {len(pub)}")
    return b58encode(_PEER_ID_PREFIX + pub)


def public_key_from_node_id(node_id: str) -> bytes:
    """Recover the raw Ed25519 key from a peer id; :class:`ProtocolError` if it is not one."""
    if type(node_id) is not str or not 0 < len(node_id) <= MAX_NODE_ID_LEN:
        raise ProtocolError(Reason.MALFORMED, "node id must be a short string")
    try:
        raw = b58decode(node_id)
    except ValueError as exc:
        raise ProtocolError(Reason.MALFORMED, f"node id is not base58: {exc}") from None
    if len(raw) != _PEER_ID_BYTES or not raw.startswith(_PEER_ID_PREFIX):
        raise ProtocolError(Reason.MALFORMED, "node id is not an Ed25519 libp2p peer id")
    pub = raw[len(_PEER_ID_PREFIX) :]
    # Re-encode to reject non-canonical spellings (e.g. extra leading '1's) of the same key,
    # so one key has exactly one id string in manifests, ledgers and logs.
    if node_id_from_public_key(pub) != node_id:
        raise ProtocolError(Reason.MALFORMED, "node id is not in canonical form")
    return pub


def as_node_id(value: Any, what: str) -> str:
    """Field check for decoded messages: a canonical Ed25519 peer id string, else MALFORMED."""
    node_id = as_str(value, what, MAX_NODE_ID_LEN)
    public_key_from_node_id(node_id)
    return node_id


def public_key_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(Encoding.Raw, PublicFormat.Raw)


def node_id_of(key: Ed25519PrivateKey) -> str:
    return node_id_from_public_key(public_key_bytes(key))


def private_key_from_seed(seed: bytes) -> Ed25519PrivateKey:
    """Deterministic key from a 32-byte seed (tests, golden vectors)."""
    return Ed25519PrivateKey.from_private_bytes(seed)


def verify_signature(pub: bytes, signature: bytes, message: bytes) -> None:
    """Ed25519 verify; any failure (bad key encoding included) is BAD_SIGNATURE."""
    if len(pub) != PUBLIC_KEY_LEN or len(signature) != SIGNATURE_LEN:
        raise ProtocolError(Reason.BAD_SIGNATURE, "wrong key or signature length")
    try:
        Ed25519PublicKey.from_public_bytes(pub).verify(signature, message)
    except (InvalidSignature, ValueError):
        raise ProtocolError(Reason.BAD_SIGNATURE, "Ed25519 signature does not verify") from None
