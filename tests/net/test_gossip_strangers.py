"""Peers that are not members, with real NodeStates: they learn nothing of the fleet (not the
manifest, not the Digest), a stranger claiming a newer manifest is cut early and counted, and
newcomers (admitted in a manifest one side has not seen yet) still get in from either side."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from peerd.net.framing import READ_TIMEOUT_S, AfterPart
from peerd.net.gossip import MANIFEST_TIMEOUT_S, SessionResult, run_session
from peerd.node.state import NodeState
from peerd.protocol import messages as msg
from peerd.protocol.manifest import Manifest
from tests.net.test_gossip import ADMIN, CTX, OUT, A, B, MemoryIO, pipe, publish, signed_node
from tests.node.fleet import FLEET, manifest, node

N = OUT  # a key that is a stranger in one test and the newcomer in another


class RecordingIO(MemoryIO):
    """Keeps every message this side sent, decoded; ``delay`` holds back one type of frame."""

    def __init__(self, inner: MemoryIO, delay: tuple[type[msg.Message], float] | None = None,
                 ) -> None:
        super().__init__(inner._send, inner._recv)
        self.sent: list[msg.Message] = []
        self.delay = delay

    async def send(self, parts: Sequence[bytes | memoryview],
                   after_part: AfterPart | None = None) -> None:
        message = msg.decode_frame(b"".join(bytes(p) for p in parts))
        if self.delay is not None and isinstance(message, self.delay[0]):
            await trio.sleep(self.delay[1])
        self.sent.append(message)
        await super().send(parts, after_part)


def types(io: RecordingIO) -> list[str]:
    return [m.TYPE for m in io.sent]


def gossip(a: NodeState, b: NodeState, *, delay_a: tuple[type[msg.Message], float] | None = None,
           virtual: bool = False) -> tuple[SessionResult, SessionResult, RecordingIO, RecordingIO]:
    """One session, ``a`` dialling. ``virtual``: on a clock that jumps whenever every task
    waits, so deadlines pass at once; only where no entry moves (a verification in a worker
    thread looks like waiting, and the clock would jump past the session's deadline)."""
    results: dict[str, SessionResult] = {}
    raw_a, raw_b = pipe()
    io_a, io_b = RecordingIO(raw_a, delay_a), RecordingIO(raw_b)

    async def side(name: str, io: RecordingIO, n: NodeState, peer: str, init: bool) -> None:
        results[name] = await run_session(io, n, CTX, peer_id=peer, initiator=init)

    async def main() -> None:
        with trio.fail_after(READ_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(side, "a", io_a, a, b.id, True)
                nursery.start_soon(side, "b", io_b, b, a.id, False)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0) if virtual else None)
    return results["a"], results["b"], io_a, io_b


def stranger(seq: int) -> NodeState:
    """Knows the fleet id and the admin key, holds the fleet's manifest of ``seq`` (0: none),
    has a key of its own: but was never admitted."""
    if seq == 0:
        s = node(N, Manifest(FLEET, 0))
    else:
        s = node(N, manifest(A, B, seq=seq))
        s.manifest_envelope = s.manifest.sign(ADMIN)
    publish(s, 1)
    return s


@pytest.mark.parametrize("dials", ["stranger", "member"])
@pytest.mark.parametrize("seq", [0, 1, 2])  # none, older than the member's, the same
def test_a_stranger_gets_neither_the_manifest_nor_the_digest(dials: str, seq: int) -> None:
    member, out = signed_node(B, 2, A, B), stranger(seq)
    publish(member, 3)
    if dials == "stranger":
        r_out, r_member, _, io_member = gossip(out, member)
    else:
        r_member, r_out, io_member, _ = gossip(member, out)
    # Before the fix, a stranger with an older manifest (or none) got the member's, every
    # member's key in it, before it was refused.
    assert types(io_member) == ["hello", "error"]
    assert io_member.sent[1] == msg.Error("not_member", f"{out.id} is not a fleet member")
    assert r_member.refused == {"not_member": 1}
    assert member.rejected == {"not_member": 1}
    assert (r_out.manifest_adopted, out.manifest.seq, out.cache) == (None, seq, [])
    assert member.cache == []


@pytest.mark.parametrize("claimant", ["stranger", "member"])
@pytest.mark.parametrize("dials", ["stranger", "member"])
def test_a_peer_claiming_a_newer_manifest_is_cut_early_and_counted(dials: str,
                                                                    claimant: str) -> None:
    # Issue 24 item 4d: a member of ours doing the same held the session for the transport's
    # 30 s read timeout, with no counter; it is cut like a stranger now.
    member = signed_node(B, 1, A, B)
    out_id = stranger(0).id if claimant == "stranger" else node(A, member.manifest).id

    async def main() -> tuple[SessionResult, float, list[msg.Message]]:
        raw_member, raw_out = pipe()
        io = RecordingIO(raw_member)
        hello = msg.Hello(FLEET, out_id, 1_000_000, ())  # and then: nothing
        if dials == "stranger":
            await raw_out.send([hello.head()])
        start = trio.current_time()
        # Before the fix this waited for the transport's read timeout (30 s), here forever.
        with trio.fail_after(READ_TIMEOUT_S):
            if dials == "member":
                await raw_out.send([hello.head()])  # an answer to the Hello to come
            result = await run_session(io, member, CTX, peer_id=out_id,
                                       initiator=dials == "member")
        return result, trio.current_time() - start, io.sent

    result, took, sent = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert took == pytest.approx(MANIFEST_TIMEOUT_S)
    assert result.refused == {"manifest_withheld": 1}  # the daemon's last_error and audit
    assert member.rejected == {"manifest_withheld": 1}  # peerd status
    assert [m.TYPE for m in sent] == ["hello", "error"]
    assert isinstance(sent[1], msg.Error)
    assert sent[1].code == "manifest_withheld"
    assert member.manifest.seq == 1


def test_a_member_sending_its_newer_manifest_within_the_bound_is_waited_for() -> None:
    # The deadline bounds a claim nobody backs, not a manifest on its way: one sent after
    # most of it still arrives and is adopted.
    a, b = signed_node(A, 2, A, B), signed_node(B, 1, A, B)
    slow = (msg.ManifestMessage, MANIFEST_TIMEOUT_S * 0.9)
    ra, rb, io_a, io_b = gossip(a, b, delay_a=slow, virtual=True)
    assert (rb.refused, rb.manifest_adopted, b.manifest.seq) == ({}, 2, 2)
    assert ra.refused == {}
    # ... and the session ran to its end (each side's last frame: its empty announcement).
    assert types(io_a) == ["hello", "manifest", "digest", "want", "digest"]
    assert types(io_b) == ["hello", "digest", "want", "digest"]


@pytest.mark.parametrize("newcomer_dials", [True, False])
def test_a_newcomer_with_the_placeholder_manifest_learns_it_and_syncs(
    newcomer_dials: bool,
) -> None:
    # [fleet] manifest unset: the newcomer starts from the daemon's placeholder (seq 0, no
    # members), so the member is a stranger to it; the member admits it under seq 2.
    member, newcomer = signed_node(B, 2, A, B, N), node(N, Manifest(FLEET, 0))
    publish(member, 3)
    publish(newcomer, 1)
    if newcomer_dials:
        r_new, r_member, _, io_member = gossip(newcomer, member)
    else:
        r_member, r_new, io_member, _ = gossip(member, newcomer)
    assert types(io_member)[:2] == ["hello", "manifest"]
    assert (r_new.refused, r_member.refused) == ({}, {})
    assert r_new.manifest_adopted == 2
    assert newcomer.manifest_envelope is not None  # it can hand it on now
    assert [(i.meta.origin, i.meta.version) for i in newcomer.cache] == [(member.id, 3)]
    assert [(i.meta.origin, i.meta.version) for i in member.cache] == [(newcomer.id, 1)]


@pytest.mark.parametrize("newcomer_dials", [True, False])
def test_a_newcomer_holding_the_newer_manifest_checks_the_member_under_it_and_syncs(
    newcomer_dials: bool,
) -> None:
    # The newcomer was admitted in seq 2, which the member has not seen: to the member it
    # is a stranger until the manifest arrives (the short deadline), to itself the member
    # is a member under seq 2.
    member, newcomer = signed_node(B, 1, A, B), signed_node(N, 2, A, B, N)
    publish(member, 3)
    publish(newcomer, 1)
    if newcomer_dials:
        r_new, r_member, io_new, _ = gossip(newcomer, member)
    else:
        r_member, r_new, _, io_new = gossip(member, newcomer)
    assert types(io_new)[:2] == ["hello", "manifest"]
    assert (r_new.refused, r_member.refused) == ({}, {})
    assert r_member.manifest_adopted == 2
    assert member.manifest.seq == 2
    assert [(i.meta.origin, i.meta.version) for i in member.cache] == [(newcomer.id, 1)]
    assert [(i.meta.origin, i.meta.version) for i in newcomer.cache] == [(member.id, 3)]


def test_a_revoked_member_is_refused_the_manifest_that_revokes_it() -> None:
    # Under the newer manifest the peer is revoked: it gets the refusal, not the manifest.
    newer = manifest(A, B, seq=1).revoke(signed_node(A, 1, A).id)
    b = signed_node(B, 1, A, B)
    b.manifest, b.manifest_envelope = newer, newer.sign(ADMIN)
    a = signed_node(A, 1, A, B)
    _, rb, _, io_b = gossip(a, b)
    assert types(io_b) == ["hello", "error"]
    assert rb.refused == {"revoked": 1}
    assert a.manifest.seq == 1
