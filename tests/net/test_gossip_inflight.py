"""No entry is downloaded from two peers at once: a session's Want leaves out what another
running session already asked for (peerd.node.inflight), and what did not arrive is asked
for again by the next session that offers it."""

from __future__ import annotations

import dataclasses

import trio

from peerd.net.gossip import run_session
from peerd.node.inflight import InFlight
from peerd.node.state import NodeState
from tests.net.test_gossip import CTX, OUT, A, B, C, pipe, publish, session, signed_node


def _relayed() -> tuple[NodeState, NodeState, NodeState, NodeState]:
    """A publishes; B and C both hold A's entry (and their own); M holds nothing yet."""
    a, b, c, m = (signed_node(k, 1, A, B, C, OUT) for k in (A, B, C, OUT))
    for n in (a, b, c):
        publish(n, 1)
    session(a, b)
    session(a, c)
    return a, b, c, m


def test_an_entry_claimed_by_another_session_is_not_asked_for() -> None:
    a, b, _, m = _relayed()
    inflight = InFlight()
    other_session = object()
    assert inflight.claim(other_session, [(a.id, 1)]) == ((a.id, 1),)
    ctx = dataclasses.replace(CTX, inflight=inflight)
    got, _ = session(m, b, a_ctx=ctx)
    # B's own entry came; A's (being fetched elsewhere) was left out of the Want.
    assert got.received == 1
    assert [(i.meta.origin, i.meta.version) for i in m.cache] == [(b.id, 1)]
    assert inflight.deduplicated == 1
    assert len(inflight) == 1  # the finished session released its claims, not the other's
    # The other session ends without delivering it: the next session offering it fetches it.
    inflight.release(other_session)
    got, _ = session(m, b, a_ctx=ctx)
    assert got.received == 1
    assert {i.meta.origin for i in m.cache} == {a.id, b.id}
    assert len(inflight) == 0


def test_two_peers_offering_the_same_new_entry_at_once_send_it_once() -> None:
    a, b, c, m = _relayed()
    inflight = InFlight()
    ctx = dataclasses.replace(CTX, inflight=inflight)
    received = []

    async def main() -> None:
        async def pull(peer: NodeState) -> None:
            io_m, io_p = pipe()
            async with trio.open_nursery() as inner:
                inner.start_soon(lambda: run_session(io_p, peer, CTX, peer_id=m.id,
                                                     initiator=False))
                received.append(await run_session(io_m, m, ctx, peer_id=peer.id,
                                                  initiator=True))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pull, b)
                nursery.start_soon(pull, c)

    trio.run(main)
    # Three distinct entries (A's, B's, C's) and three transfers: A's crossed once, whether
    # the two sessions overlapped (the claim left it out of one Want) or not (the ledger did).
    assert sum(r.received for r in received) == 3
    assert not any(r.refused for r in received)
    assert {i.meta.origin for i in m.cache} == {a.id, b.id, c.id}
    assert len(inflight) == 0


def test_claims_are_per_session_and_released_whole() -> None:
    flight = InFlight()
    s1, s2 = object(), object()
    assert flight.claim(s1, [("o1", 1), ("o2", 4)]) == (("o1", 1), ("o2", 4))
    assert flight.claim(s2, [("o2", 4), ("o3", 2), ("o1", 1)]) == (("o3", 2),)
    assert flight.deduplicated == 2
    assert flight.claim(s1, [("o1", 1)]) == (("o1", 1),)  # its own claim stays valid
    assert flight.holder(("o2", 4)) is s1
    flight.release(s1)
    assert flight.holder(("o2", 4)) is None
    assert flight.holder(("o3", 2)) is s2
    assert flight.claim(s2, [("o2", 5)]) == (("o2", 5),)  # another version is another key
    flight.release(s2)
    assert len(flight) == 0
    flight.release(s2)  # releasing twice (an already-ended session) is harmless
    assert flight.claim(object(), []) == ()
    assert len(flight) == 0
