"""A refused stranger always reads Hello + ``error`` (issue 27 item 6, docs/protocol.md).

Before, a member closed the stranger's connection the moment the ``error`` frame was
written; a stranger that had not read it yet lost it (found from outside: 9 of 142 js-libp2p
sessions with identify on read nothing). Now the member half-closes the stream, drains the
stranger's bytes and waits for it to hang up, within ``REFUSAL_LINGER_S``. The stranger here
(tests/net/refused_client.py) reads 0 to 300 ms late and sends late bytes; on the code before
the fix it lost the refusal in most sessions (the numbers are in the docstring of the test).
"""

from __future__ import annotations

import random

import pytest

from peerd.net.gossip import run_session
from peerd.net.transport import Stream, open_transport
from peerd.net.transport_config import REFUSAL_LINGER_S
from tests.net.hosts import LOOPBACK, run
from tests.net.refused_client import Outcome, refused_session
from tests.net.test_gossip import CTX, A, B, signed_node
from tests.node.fleet import FLEET

#: Sessions of the CI form; the long form runs the 200 of the issue's done-when.
SESSIONS = 30
LONG_SESSIONS = 200
#: How late a stranger reads: up to this, well inside REFUSAL_LINGER_S.
MAX_WAIT_S = 0.3


async def _refusals(count: int) -> list[Outcome]:
    member = signed_node(B, 2, A, B)  # its manifest (seq 2) lists A and B only
    rng = random.Random(27)

    async def handler(stream: Stream) -> None:
        await run_session(stream, member, CTX, peer_id=stream.peer_id, initiator=False)

    outcomes: list[Outcome] = []
    async with open_transport(B, handler, LOOPBACK,
                              admit=lambda p: p in (A_ID, B_ID)) as t:
        for _ in range(count):
            outcomes.append(await refused_session(t.peer_id, t.listen_addrs[0], FLEET,
                                                  wait_s=rng.uniform(0, MAX_WAIT_S)))
    return outcomes


A_ID, B_ID = signed_node(A, 1, A).id, signed_node(B, 1, B).id


def _check(outcomes: list[Outcome]) -> None:
    lost = [o for o in outcomes if not o.refused_politely]
    assert not lost, (f"{len(lost)} of {len(outcomes)} strangers did not read Hello + "
                      f"not_member; first: {lost[0]}")


def _run_refusals(count: int) -> list[Outcome]:
    box: list[list[Outcome]] = []

    async def main() -> None:
        box.append(await _refusals(count))

    run(main, deadline_s=count * (MAX_WAIT_S + REFUSAL_LINGER_S) + 60)
    return box[0]


def test_every_refused_stranger_reads_hello_and_not_member() -> None:
    """Before the fix: 29 of 30 sessions lost the refusal, twice (commit edf8d92)."""
    _check(_run_refusals(SESSIONS))


@pytest.mark.long
def test_two_hundred_refused_strangers_all_read_the_refusal() -> None:
    _check(_run_refusals(LONG_SESSIONS))


def test_a_stranger_cannot_hold_the_connection_past_the_linger() -> None:
    """A stranger that neither reads nor hangs up is closed about REFUSAL_LINGER_S after
    its Hello, not at the end of its probation (PROBATION_S). Before the fix: 0.02 s (at
    once, whether the stranger had read the refusal or not)."""
    box: list[list[Outcome]] = []

    async def main() -> None:
        member = signed_node(B, 2, A, B)

        async def handler(stream: Stream) -> None:
            await run_session(stream, member, CTX, peer_id=stream.peer_id, initiator=False)

        async with open_transport(B, handler, LOOPBACK,
                                  admit=lambda p: p in (A_ID, B_ID)) as t:
            box.append([await refused_session(t.peer_id, t.listen_addrs[0], FLEET,
                                              wait_s=REFUSAL_LINGER_S + 3)])

    run(main, deadline_s=30)
    closed = box[0][0].closed_by_member_s
    assert closed is not None, box
    assert REFUSAL_LINGER_S <= closed < REFUSAL_LINGER_S + 1.5, closed
