"""A 1,000-member manifest spreads through a real gossip session (its frame is larger than
any other control frame), and the node that adopts it admits a member only it lists."""

from __future__ import annotations

import hashlib

from peerd.protocol.identity import node_id_of, private_key_from_seed, public_key_bytes
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN
from peerd.protocol.manifest import Manifest, Member
from peerd.protocol.messages import ManifestMessage
from tests.net.test_gossip import ADMIN, A, B, publish, session, signed_node
from tests.node.fleet import FLEET, node


def test_a_1000_member_manifest_is_adopted_over_a_session_and_admits_its_members() -> None:
    others = [private_key_from_seed(hashlib.sha256(b"fleet node %d" % i).digest())
              for i in range(998)]
    members = tuple(sorted((Member(node_id_of(k), public_key_bytes(k)) for k in (A, B, *others)),
                           key=lambda m: m.node_id))
    big = Manifest(FLEET, 2, members)
    assert len(ManifestMessage(big.sign(ADMIN)).to_wire()) > MAX_CONTROL_FRAME_LEN
    a = signed_node(A, 1, A, B)  # holds the old two-member manifest
    b = node(B, big)
    b.manifest_envelope = big.sign(ADMIN)
    publish(a, 1)
    publish(b, 1)
    r_a, r_b = session(a, b)
    assert (r_a.refused, r_b.refused) == ({}, {})
    assert r_a.manifest_adopted == 2
    assert a.manifest == big
    assert [(i.meta.origin, i.meta.version) for i in a.cache] == [(b.id, 1)]
    # A member that only the new manifest lists now gets in with a.
    c = node(others[0], big)
    c.manifest_envelope = big.sign(ADMIN)
    publish(c, 4)
    r_a2, r_c = session(a, c)
    assert (r_a2.refused, r_c.refused) == ({}, {})
    assert (c.id, 4) in [(i.meta.origin, i.meta.version) for i in a.cache]
