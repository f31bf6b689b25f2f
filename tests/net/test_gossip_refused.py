"""The refused side of a session (issue 13): a node the fleet has not admitted learns that
*it* was refused, and why, instead of counting the peer's Error as a malformed message."""

from __future__ import annotations

import msgpack
import pytest
import trio

from peerd.core.reasons import Reason
from peerd.net.gossip import SessionResult, run_session
from peerd.protocol import messages as msg
from peerd.protocol.errors import PeerRefusedError
from tests.net.test_gossip import ADMIN, CTX, A, B, pipe, signed_node
from tests.net.test_gossip_strangers import gossip, stranger
from tests.node.fleet import FLEET, manifest


@pytest.mark.parametrize("dials", ["stranger", "member"])
@pytest.mark.parametrize("seq", [1, 2])  # the stranger's manifest: older, the same
def test_a_node_refused_as_a_stranger_counts_not_member(dials: str, seq: int) -> None:
    member, out = signed_node(B, 2, A, B), stranger(seq)
    if dials == "stranger":
        r_out, r_member, _, _ = gossip(out, member)
    else:
        r_member, r_out, _, _ = gossip(member, out)
    assert r_out.refused_as == "not_member"
    # Before: {"malformed": 1}, and `peerd status` said "malformed: peer refused: not_member".
    assert r_out.refused == {"not_member": 1}
    assert out.rejected.get("not_member", 0) >= 1
    assert "malformed" not in out.rejected
    assert r_member.refused_as is None  # the member refused; it was not refused


def test_a_revoked_node_learns_it_was_revoked() -> None:
    newer = manifest(A, B, seq=1).revoke(signed_node(A, 1, A).id)
    b = signed_node(B, 1, A, B)
    b.manifest, b.manifest_envelope = newer, newer.sign(ADMIN)
    a = signed_node(A, 1, A, B)  # still holds the manifest that lists it
    ra, _, _, _ = gossip(a, b)
    assert ra.refused_as == "revoked"
    assert a.rejected == {"revoked": 1}


@pytest.mark.parametrize(("code", "reason", "membership"), [
    ("not_member", Reason.NOT_MEMBER, Reason.NOT_MEMBER),
    ("revoked", Reason.REVOKED, Reason.REVOKED),
    ("expired", Reason.EXPIRED, Reason.EXPIRED),
    # Anything else the peer says stays what it was: a refusal of our bytes.
    ("bad_signature", Reason.MALFORMED, None),
    ("wrong_fleet", Reason.MALFORMED, None),
    ("made_up", Reason.MALFORMED, None),
])
def test_only_membership_refusals_change_the_reason(code: str, reason: Reason,
                                                    membership: Reason | None) -> None:
    err = PeerRefusedError(code, "text")
    assert (err.reason, err.membership) == (reason, membership)
    assert str(err) == f"{reason.value}: peer refused: {code} text"


@pytest.mark.parametrize(("version", "reason"), [(0, "version_too_old"),
                                                 (2, "version_unknown")])
def test_a_peer_of_another_protocol_version_is_counted_under_the_wire_name(
    version: int, reason: str,
) -> None:
    # Issue 24 item 4e: both sides counted these as "malformed", which hid that one of them
    # must be upgraded (and looked like an attack).
    b = signed_node(B, 1, A, B)
    a_id = signed_node(A, 1, A, B).id
    hello = msgpack.packb({"type": "hello", "v": version, "fleet": FLEET, "node": a_id,
                           "manifest_seq": 1, "caps": []}, use_bin_type=True)

    async def main() -> tuple[SessionResult, list[bytes]]:
        raw_b, raw_a = pipe()
        await raw_a.send([hello])
        result = await run_session(raw_b, b, CTX, peer_id=a_id, initiator=False)
        raw_b._send.close()
        return result, [bytes(f) async for f in raw_a._recv]

    result, frames = trio.run(main)
    assert result.refused == {reason: 1}
    assert b.rejected == {reason: 1}
    error = msg.decode_frame(frames[-1])
    assert isinstance(error, msg.Error)
    assert error.code == reason


@pytest.mark.parametrize("code", ["version_too_old", "version_unknown"])
def test_a_peers_version_refusal_is_counted_under_its_code(code: str) -> None:
    err = PeerRefusedError(code, "upgrade")
    assert (err.reason.value, err.membership) == (code, None)

    a = signed_node(A, 1, A, B)
    b_id = signed_node(B, 1, A, B).id

    async def main() -> SessionResult:
        raw_a, raw_b = pipe()
        await raw_b.send([msg.Error(code, "upgrade").head()])  # its answer to our Hello
        return await run_session(raw_a, a, CTX, peer_id=b_id, initiator=True)

    result = trio.run(main)
    assert result.refused == {code: 1}
    assert a.rejected == {code: 1}
