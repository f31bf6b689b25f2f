"""Mend 15 (peerd/net/peertables.py): py-libp2p's per-peer state bounded by us, its own stream
handlers fenced (issue 24, item 1). Loopback only, one trio process; the strangers are whole
py-libp2p hosts (tests/net/churn.py), so identify runs both ways as with any libp2p peer.

On py-libp2p 0.8.1 unmended, about 1,000 identified strangers evicted the host's own
peerstore entry, and the next identify request it served raised ``PeerStoreError`` out of
the swarm: the host was gone. The bound here is shrunk to 8 so that a dozen strangers go
past it.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.transport import Stream, Transport, open_transport
from peerd.protocol import messages as msg
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN
from tests.net.churn import Churn, churn
from tests.net.hosts import LOOPBACK, run

FLEET = b"\x01" * 16
SMALL_BOUND = 8


async def _serve(stream: Stream) -> None:
    """Refuses every Hello, as the daemon refuses a stranger's."""
    await stream.recv(MAX_CONTROL_FRAME_LEN)
    await stream.send([msg.Error("not_member").head()])


def _served(seen: Churn) -> int:
    return seen.outcomes.get("error not_member", 0)


def _addr(t: Transport) -> str:
    return f"/ip4/127.0.0.1/tcp/{t.port}"


def _lib(t: Transport) -> Any:
    return t._host  # the library's own state is what these tests inspect


def test_the_hosts_own_entry_survives_a_peerstore_full_of_strangers() -> None:
    async def body() -> None:
        # admit=None: everyone is admitted and kept, so only the bound can hold the store.
        async with open_transport(Ed25519PrivateKey.generate(), _serve, LOOPBACK) as t:
            t.library_tables._max_peers = SMALL_BOUND
            _lib(t).get_peerstore().max_peers = SMALL_BOUND
            seen = await churn(FLEET, t.peer_id, _addr(t), 3 * SMALL_BOUND, concurrency=4)
            store = _lib(t).get_peerstore()
            assert store.has_peer(_lib(t).get_id())  # the entry identify serves from
            assert t.library_tables.evicted > 0
            assert len(store.peer_ids()) <= SMALL_BOUND + 4  # + those connected right now
            assert _served(seen) == seen.visits, seen  # nobody is refused a slot: admit=None
            assert t.library_tables.handler_errors == 0
            # Its identify handler still answers (unmended, it raised and the host ended).
            again = await churn(FLEET, t.peer_id, _addr(t), 2)
            assert _served(again) == 2, again

    run(body, 90)


def test_outsiders_are_forgotten_and_their_inbound_tasks_end() -> None:
    async def body() -> None:
        async with open_transport(Ed25519PrivateKey.generate(), _serve, LOOPBACK,
                                  admit=lambda peer: False) as t:
            swarm = _lib(t).get_network()
            before = swarm._inbound_limiter.borrowed_tokens
            await churn(FLEET, t.peer_id, _addr(t), 40, concurrency=4)
            with trio.fail_after(10):
                while t.library_tables.sizes()["connections"]:  # noqa: ASYNC110 - a count
                    await trio.sleep(0.05)
                # Each accepted connection's task used to live (holding its inbound slot)
                # until the swarm ended: 40 here, ~1 per stranger ever seen.
                while swarm._inbound_limiter.borrowed_tokens > before:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            sizes = t.library_tables.sizes()
            assert sizes["peerstore"] == 1, sizes  # the host itself
            assert sizes["identified"] == 0  # outsiders are never identified
            assert sizes["per_peer_entries"] <= 2, sizes
            assert t.library_tables.forgotten >= 40

    run(body, 90)


def test_a_library_handler_that_raises_costs_one_stream_not_the_host() -> None:
    async def boom(stream: Any) -> None:
        raise RuntimeError("a library handler's bug")

    async def body() -> None:
        async with open_transport(Ed25519PrivateKey.generate(), _serve, LOOPBACK) as t, \
                open_transport(Ed25519PrivateKey.generate(), _serve, LOOPBACK) as client:
            _lib(t).set_stream_handler("/boom/1.0.0", boom)  # as identify or ping would be
            await client.connect(t.peer_id, [_addr(t)])
            for _ in range(3):
                stream = await _lib(client).new_stream(_lib(t).get_id(), ["/boom/1.0.0"])
                with trio.move_on_after(5), suppress(Exception):  # reset by the target
                    await stream.read(1)
            with trio.fail_after(5):
                while t.library_tables.handler_errors < 3:  # noqa: ASYNC110 - a count
                    await trio.sleep(0.05)
            # The host is still up and serves our protocol.
            seen = await churn(FLEET, t.peer_id, _addr(t), 1)
            assert _served(seen) == 1, seen

    run(body, 60)
