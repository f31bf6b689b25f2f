"""A manifest binds members to cordial agents (issue 24 item 2): the binding is a fourth item
of a member, present only when set, so a manifest binding none keeps the old bytes and an old
manifest still decodes; it round-trips signed; out-of-range or mistyped indices are malformed;
one agent is never bound to two members; the largest bound manifest fits its frame."""

from __future__ import annotations

import dataclasses

import pytest

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of, public_key_bytes
from peerd.protocol.limits import (
    MAX_AGENT_INDEX,
    MAX_MANIFEST_FRAME_LEN,
    MAX_MEMBERS,
    MAX_REVOKED,
)
from peerd.protocol.manifest import Manifest, accept_manifest
from peerd.protocol.wire import pack, unpack_exact
from tests.protocol.helpers import ADMIN, ALICE, BOB, FLEET, MALLORY, NOW
from tests.protocol.test_protocol_manifest_large import frame_of, members

ADMIN_PUB = public_key_bytes(ADMIN)


def _body(member_items: list[list[object]]) -> bytes:
    return pack({"type": "manifest", "fleet": FLEET, "seq": 3, "members": member_items,
                 "revoked": []})


def test_an_old_manifest_decodes_and_an_unbound_one_keeps_its_bytes() -> None:
    old = _body([[node_id_of(ALICE), public_key_bytes(ALICE), None]])  # pre-binding format
    m = Manifest.from_bytes(old)
    assert m.members[0].agent is None
    assert m.to_bytes() == old
    assert not m.binds_agents
    assert m.agent_of(node_id_of(ALICE)) is None


def test_a_binding_round_trips_signed() -> None:
    m = Manifest(FLEET, 1).admit(public_key_bytes(ALICE), None, 0)
    m = m.admit(public_key_bytes(BOB), 4e9, 7).admit(public_key_bytes(MALLORY), None)
    got = accept_manifest(None, m.sign(ADMIN), ADMIN_PUB, FLEET)
    assert got == m
    assert (got.agent_of(node_id_of(ALICE)), got.agent_of(node_id_of(BOB)),
            got.agent_of(node_id_of(MALLORY))) == (0, 7, None)
    assert got.binds_agents
    items = unpack_exact(m.to_bytes(), 1 << 20)["members"]
    assert sorted(len(i) for i in items) == [3, 4, 4]


@pytest.mark.parametrize("agent", [-1, MAX_AGENT_INDEX + 1, 1.0, "1", True, None])
def test_a_bad_agent_index_is_malformed(agent: object) -> None:
    body = _body([[node_id_of(ALICE), public_key_bytes(ALICE), None, agent]])
    with pytest.raises(ProtocolError) as exc:
        Manifest.from_bytes(body)
    assert exc.value.reason is Reason.MALFORMED


@pytest.mark.parametrize("n", [2, 5])
def test_a_member_of_another_length_is_refused(n: int) -> None:
    full: list[object] = [node_id_of(ALICE), public_key_bytes(ALICE), None, 1, 2]
    item = full[:n]
    with pytest.raises(ProtocolError) as exc:
        Manifest.from_bytes(_body([item]))
    assert exc.value.reason in (Reason.MALFORMED, Reason.TOO_LARGE)


def test_one_agent_is_never_bound_to_two_members() -> None:
    m = Manifest(FLEET, 1).admit(public_key_bytes(ALICE), None, 1)
    with pytest.raises(ValueError, match="agent 1 is already bound to"):
        m.admit(public_key_bytes(BOB), None, 1)
    with pytest.raises(ValueError, match="agent must be in"):
        m.admit(public_key_bytes(BOB), None, MAX_AGENT_INDEX + 1)
    # the member itself may be re-admitted with it, or moved to another agent
    assert m.admit(public_key_bytes(ALICE), 4e9, 1).agent_of(node_id_of(ALICE)) == 1
    assert m.admit(public_key_bytes(ALICE), None, 2).agent_of(node_id_of(ALICE)) == 2


def test_the_largest_bound_manifest_fits_its_frame_limit() -> None:
    bound = tuple(dataclasses.replace(x, agent=MAX_AGENT_INDEX - i)
                  for i, x in enumerate(members(MAX_MEMBERS, not_after=NOW + 3600.5)))
    most = Manifest(FLEET, 2**40, bound,
                    frozenset(x.node_id for x in members(MAX_REVOKED, "revoked")))
    assert len(frame_of(most)) <= MAX_MANIFEST_FRAME_LEN
