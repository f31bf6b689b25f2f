"""A node publishing in a compact encoding (``[fleet] entry_encoding``): its peers verify
the encoded bytes, cache float32 models within the codec's error, relay the origin's bytes
untouched, and judge the decoded values (finite, norm) as they judge raw ones."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
import torch

from peerd.core.reasons import Reason
from peerd.core.validate import ValidationLimits
from peerd.node.state import Held, NodeState, sign_own, verify
from peerd.protocol import messages as msg
from peerd.protocol.encoding import Encoding
from peerd.protocol.entry import EntryBody
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.tensors import TensorIndexItem
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest, model, node

A, B, C = key(1), key(2), key(3)
MAN = manifest(A, B, C)


def publish(n: NodeState, version: int = 1) -> msg.Entry:
    entry, message = sign_own(n.key, FLEET, params=model(), version=version, created_at=NOW,
                              num_examples=50, encoding=n.encoding)
    n.set_own(entry, message)
    return message


def received(n: NodeState, message: msg.Entry) -> Held:
    return verify(message, fleet_id=FLEET, manifest=n.manifest, ledger=n.ledger.view(),
                  schema=SCHEMA, limits=n.limits, now=NOW)


@pytest.mark.parametrize(("name", "tol"), [("float16", 1e-3), ("bfloat16", 4e-3),
                                           ("int8", 2e-3), ("int8:16", 2e-3)])
def test_a_float32_node_caches_an_encoded_entry_as_float32(name: str, tol: float) -> None:
    a = dataclasses.replace(node(A, MAN), encoding=Encoding.parse(name))
    b, c = node(B, MAN), node(C, MAN)
    message = publish(a)
    raw = sign_own(A, FLEET, params=model(), version=1, created_at=NOW, num_examples=50)[1]
    assert len(message.payload) < len(raw.payload)
    held = received(b, message)
    assert b.accept(held, sender=a.id, now=NOW) is None
    want = model()
    for spec in SCHEMA.specs:
        got = held.entry.params[spec.name]
        assert got.dtype == torch.float32
        assert tuple(got.shape) == spec.shape
        assert torch.allclose(got, want[spec.name], atol=tol, rtol=0)
    assert not torch.equal(held.entry.params["fc.weight"], want["fc.weight"])
    # The digest is the encoded payload's, the one the origin signed; relays keep its bytes.
    assert held.entry.meta.digest == hashlib.sha256(bytes(message.payload)).hexdigest()
    [out] = b.to_send(msg.Want(((a.id, 1),)))
    assert bytes(out.message.payload) == bytes(message.payload)
    assert out.message.envelope == message.envelope
    assert received(c, out.message).entry.meta.digest == held.entry.meta.digest


def test_the_own_entry_in_a_lossy_encoding_is_its_decoding() -> None:
    a = dataclasses.replace(node(A, MAN), encoding=Encoding("int8", 0))
    publish(a)
    assert a.own is not None
    own = a.own.entry.params["fc.weight"]
    assert own.dtype == torch.float32
    assert torch.allclose(own, model()["fc.weight"], atol=2e-3, rtol=0)


def _forged(weight: bytes, codec: str, block: int) -> msg.Entry:
    """A member's entry whose fc.weight bytes it chose (fc.bias raw zeros)."""
    _, good = sign_own(A, FLEET, params=model(), version=1, created_at=NOW, num_examples=50)
    body = EntryBody.from_bytes(good.envelope.body)
    bias = np.zeros(4, dtype="<f4").tobytes()
    payload = bias + weight
    index = (TensorIndexItem("fc.bias", "float32", (4,), 0),
             TensorIndexItem("fc.weight", "float32", (4, 3), len(bias), codec, block))
    fields = {f: getattr(body, f) for f in body.__slots__}
    fields.update(tensors=index, payload_len=len(payload),
                  digest=hashlib.sha256(payload).hexdigest())
    signed = SignedEnvelope.sign(A, ENTRY_DOMAIN, FLEET, EntryBody(**fields).to_bytes())
    return msg.Entry(signed, payload)


def test_decoded_values_are_validated_like_raw_ones() -> None:
    b = node(B, MAN, limits=ValidationLimits(max_norm=100.0))
    ok = np.full(12, 0.5, dtype="<f2").tobytes()
    received(b, _forged(ok, "float16", 0))  # passes
    inf = np.array([np.inf] + [0.0] * 11, dtype="<f2").tobytes()
    with pytest.raises(ProtocolError) as exc:
        received(b, _forged(inf, "float16", 0))
    assert exc.value.reason is Reason.NON_FINITE
    # int8 with a finite, in-range scale whose values reach 127 · 1e3: too large a model.
    big = np.array([1e3], dtype="<f4").tobytes() + np.full(12, 127, dtype=np.int8).tobytes()
    with pytest.raises(ProtocolError) as exc:
        received(b, _forged(big, "int8", 0))
    assert exc.value.reason is Reason.NORM_TOO_LARGE
