"""Golden vectors: fixed key -> exact bytes -> exact signature, and domain separation.

If one of these changes, the wire format changed: every deployed node would reject the new
bytes (or accept different ones), so bump the protocol version rather than the constants.
"""

from __future__ import annotations

import hashlib

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from peerd.core.reasons import Reason
from peerd.protocol.envelope import ENTRY_DOMAIN, MANIFEST_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import (
    node_id_from_public_key,
    public_key_bytes,
    public_key_from_node_id,
)
from peerd.protocol.manifest import decode_manifest_file, encode_manifest_file, verify_manifest
from tests.protocol.helpers import ADMIN, ALICE, FLEET, NOW, OTHER_FLEET, SCHEMA_ID, entry, manifest

GOLDEN_BODY = (
    "8aa474797065a5656e747279a5666c656574c410000102030405060708090a0b0c0d0e0fa66f726967696e"
    "d934313244334b6f6f5751436b426d314259746b48706f637843774d675238796a69744565484778387370"
    "7a63444c477432676b426da776657273696f6e01aa637265617465645f6174cb41d954fc40000000a97363"
    "68656d615f6964c42029a8ca41b2f08c5b9419aaab65a1f37cc6c5f909f18c270491f7cdaec98c4185ac6e"
    "756d5f6578616d706c65730aa774656e736f72739394b6626e2e6e756d5f626174636865735f747261636b"
    "6564a5696e743634900094a766632e62696173a7666c6f6174333291030894a966632e776569676874a766"
    "6c6f6174333292030414ae7061796c6f61645f736861323536c420c73ead2b86fe09b870e95da97f03f3ed"
    "a9e0b007adf1d64a8de2f31fd31c208dab7061796c6f61645f6c656e44"
)
GOLDEN_SIG = (
    "3328acf5192df9602dc2b7152e79d039c745c62ca3a6eb8fbd1ddc8a0198d57d"
    "eba992e77665234fd43fc29a2e4886c1ea5b4a113f6dcb32de3dc591b25d580d"
)
GOLDEN_FRAME_SHA256 = "8530b4623dc0be8e71f868fbb7db802401b73039f2fa795087e92ce1385bdc6b"
GOLDEN_MANIFEST_SIG = (
    "7b0be660fc2c4561938258c52fe7c247c9ab3f7ea707c7b9f91e50f364d2fb6b"
    "202320febb9b37235133102901fa1766e8d678ec4d71ea24d5b038d53cee8903"
)


def test_libp2p_spec_vector_ed25519_peer_id() -> None:
    # libp2p peer-ids spec test vector (seed 7e08..., public key 1ed1...), independently
    # published peer id: pins our hand-written base58/multihash/protobuf encoding.
    key = Ed25519PrivateKey.from_private_bytes(
        bytes.fromhex("7e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d")
    )
    pub = public_key_bytes(key)
    assert pub.hex() == "1ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e"
    node_id = node_id_from_public_key(pub)
    assert node_id == "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"
    assert public_key_from_node_id(node_id) == pub


def test_rfc8032_test1_signature() -> None:
    # RFC 8032 section 7.1 TEST 1 (empty message): the signer is standard Ed25519.
    key = Ed25519PrivateKey.from_private_bytes(
        bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    )
    assert key.sign(b"").hex() == (
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )


def test_golden_entry_bytes_and_signature() -> None:
    msg = entry()
    assert msg.envelope.body.hex() == GOLDEN_BODY
    assert msg.envelope.sig.hex() == GOLDEN_SIG
    assert hashlib.sha256(msg.to_wire()).hexdigest() == GOLDEN_FRAME_SHA256
    # Independent re-derivation: the signature is Ed25519 over domain || fleet || body.
    Ed25519PublicKey.from_public_bytes(public_key_bytes(ALICE)).verify(
        bytes.fromhex(GOLDEN_SIG), ENTRY_DOMAIN + FLEET + bytes.fromhex(GOLDEN_BODY)
    )


def test_golden_body_layout_read_by_plain_msgpack() -> None:
    body = msgpack.unpackb(bytes.fromhex(GOLDEN_BODY))
    assert body["type"] == "entry"
    assert body["origin"] == node_id_from_public_key(public_key_bytes(ALICE))
    assert body["created_at"] == NOW
    assert body["schema_id"] == bytes.fromhex(SCHEMA_ID)
    assert [t[0] for t in body["tensors"]] == sorted(t[0] for t in body["tensors"])
    assert body["tensors"][1] == ["fc.bias", "float32", [3], 8]


def test_golden_manifest_signature() -> None:
    data = encode_manifest_file(manifest().sign(ADMIN))
    env = decode_manifest_file(data)
    assert env.sig.hex() == GOLDEN_MANIFEST_SIG
    assert verify_manifest(env, public_key_bytes(ADMIN), FLEET).seq == 3


def test_domain_separation_entry_signature_is_not_a_manifest_signature() -> None:
    # An admin who is also a node signs an entry whose body happens to be a manifest body:
    # the entry domain tag makes it worthless as a manifest.
    body = manifest().to_bytes()
    as_entry = SignedEnvelope.sign(ADMIN, ENTRY_DOMAIN, FLEET, body)
    with pytest.raises(ProtocolError) as exc:
        verify_manifest(as_entry, public_key_bytes(ADMIN), FLEET)
    assert exc.value.reason is Reason.BAD_SIGNATURE
    as_manifest = SignedEnvelope.sign(ADMIN, MANIFEST_DOMAIN, FLEET, body)
    assert verify_manifest(as_manifest, public_key_bytes(ADMIN), FLEET).seq == 3


def test_domain_separation_manifest_signature_is_not_an_entry_signature() -> None:
    msg = entry()
    forged = SignedEnvelope(
        fleet_id=FLEET,
        key=msg.envelope.key,
        body=msg.envelope.body,
        sig=ALICE.sign(MANIFEST_DOMAIN + FLEET + msg.envelope.body),
    )
    with pytest.raises(ProtocolError) as exc:
        forged.verify(ENTRY_DOMAIN, FLEET)
    assert exc.value.reason is Reason.BAD_SIGNATURE
    assert msg.envelope.verify(ENTRY_DOMAIN, FLEET) == msg.envelope.body


def test_signature_from_another_fleet_does_not_verify_here() -> None:
    theirs = entry(fleet=OTHER_FLEET).envelope
    with pytest.raises(ProtocolError) as exc:
        theirs.verify(ENTRY_DOMAIN, FLEET)
    assert exc.value.reason is Reason.WRONG_FLEET
    # Relabelling the clear-text fleet id does not help: the signature binds the real one.
    relabelled = SignedEnvelope(FLEET, theirs.key, theirs.body, theirs.sig)
    with pytest.raises(ProtocolError) as exc:
        relabelled.verify(ENTRY_DOMAIN, FLEET)
    assert exc.value.reason is Reason.BAD_SIGNATURE
