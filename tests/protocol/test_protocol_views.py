"""View entries (issue 17) where they differ from FedCache's knowledge entries: the boundary
between the two layouts in both directions, the schema as a view's reference, the view
schema's own id and frame bound, what signing and the schema refuse, and the decoder
invariant over any signed ids and vectors. (What views share with FedCache — round trip,
ledger, hostile ids/values/shapes/counts, bit flips, the body invariant — is tested over both
layouts in test_protocol_knowledge.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol.entry import sign_entry
from peerd.protocol.errors import ProtocolError
from peerd.protocol.kinds import KEYS, KNOWLEDGE
from peerd.protocol.knowledge import KnowledgeSchema, sign_keys, sign_knowledge, sign_view
from peerd.protocol.limits import MAX_VIEW_ABS, MAX_VIEW_IDS
from peerd.protocol.messages import Entry
from tests.protocol.helpers import ALICE, FLEET, NOW
from tests.protocol.test_protocol_knowledge import (
    VECTORS,
    VIEW_IDS,
    VIEWS,
    VS,
    body_dict,
    forged,
    refusal,
)

#: A FedCache schema of the same width, classes and encoder as VS: only the views differ.
FEDCACHE = KnowledgeSchema(key_dim=3, num_classes=10, encoder="test-views", max_samples=6)


def view(**kw: object) -> Entry:
    return VIEWS.sign(**kw)  # type: ignore[arg-type]


def test_the_view_schema_id_names_the_index_and_fedcache_ids_are_unchanged() -> None:
    assert VS.id != FEDCACHE.id  # the same settings but views: another schema
    assert KnowledgeSchema(3, 10, "test-views", 6, view_ids=101).id != VS.id
    assert VS.frame_limit() < FEDCACHE.frame_limit()  # no keys entry to allow for


def test_view_and_fedcache_nodes_refuse_each_other() -> None:
    keys = sign_keys(ALICE, FLEET, schema=FEDCACHE, version=1, created_at=NOW,
                     keys=np.eye(2, 3, dtype=np.float32), labels=np.array([0, 1]))
    logits = sign_knowledge(ALICE, FLEET, schema=FEDCACHE, version=2, created_at=NOW,
                            ids=np.array([0, 1]), logits=np.zeros((2, 10)),
                            keys_digest=keys.body.digest)
    assert refusal(VIEWS.admit, keys.to_message()) is Reason.SCHEMA_MISMATCH
    assert refusal(VIEWS.admit, logits.to_message()) is Reason.SCHEMA_MISMATCH
    assert refusal(VIEWS.admit, view(), schema=FEDCACHE) is Reason.SCHEMA_MISMATCH


def test_a_view_must_name_its_schema_as_its_reference() -> None:
    named = sign_entry(ALICE, FLEET, version=5, created_at=NOW, schema_id=VS.id, num_examples=3,
                       tensors={"ids": VIEW_IDS, "vectors": VECTORS.astype("<f2")},
                       kind=KNOWLEDGE, keys_digest="ab" * 32).to_message()
    assert refusal(VIEWS.admit, named) is Reason.SCHEMA_MISMATCH
    body = {**body_dict(view()), "kind": KEYS}
    body.pop("keys_sha256")
    assert refusal(VIEWS.admit, forged(body, view().payload)) is Reason.SCHEMA_MISMATCH


def test_signing_and_the_schema_refuse_what_admission_would() -> None:
    with pytest.raises(ValueError, match="vectors"):
        view(values=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="view schema"):
        sign_view(ALICE, FLEET, schema=FEDCACHE, version=2, created_at=NOW, ids=VIEW_IDS,
                  vectors=VECTORS)
    with pytest.raises(ValueError, match="view_ids"):
        KnowledgeSchema(3, 10, "x", view_ids=MAX_VIEW_IDS + 1)
    with pytest.raises(ValueError, match="no keys"):
        VS.layout(KEYS, 1)


def _half(bits: int) -> float:
    return float(np.array(bits, dtype=np.uint16).view(np.float16))


#: Every float16 value by its bit pattern (NaN and ±inf included, about 3 %). st.floats(width=16)
#: rejected 89 % of its draws in downcasting (Hypothesis statistics: 84 valid cases of 8,943,
#: 50 s); drawing bits makes every case valid.
HALVES = st.integers(0, 0xFFFF).map(_half)


@settings(max_examples=200, deadline=None)
# Ids near the index's range (-2 .. view_ids + 1) as well as anywhere in int32, so that both
# admitted and refused views are common (any int32 alone made nearly every view a refusal).
@given(ids=st.lists(st.integers(-2, VS.view_ids + 1) | st.integers(-(2**31), 2**31 - 1),
                    min_size=1, max_size=6),
       cells=st.lists(HALVES, min_size=18, max_size=18))
def test_decoder_invariant_for_view_payload_values(ids: list[int], cells: list[float]) -> None:
    # Whatever ids and vectors are signed, admission answers with a view whose ids are
    # strictly increasing inside the index and whose vectors are finite and bounded, or a
    # ProtocolError.
    vectors = np.array(cells[: 3 * len(ids)], dtype=np.float32).reshape(len(ids), 3)
    try:
        v = VIEWS.admit(VIEWS.raw(ids, vectors))
    except ProtocolError:
        event("refused")
        return
    event("admitted")
    got = v.tensors["ids"].astype(np.int64)
    assert got[0] >= 0
    assert got[-1] < VS.view_ids
    assert bool(np.all(np.diff(got) > 0))
    vec = v.tensors["vectors"].astype(np.float32)
    assert bool(np.isfinite(vec).all())
    assert float(np.abs(vec).max()) <= MAX_VIEW_ABS
