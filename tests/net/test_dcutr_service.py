"""peerd's DCUtR service (peerd/net/dcutr.py, ``[network] hole_punch``; issue 27 item 3) on
loopback: the key parses and needs ``relays``; a DCUtR stream from a peer the transport does
not admit is reset before anything in it is read or dialled, while an admitted member's is
answered; a CONNECT's addresses are bounded; the per-peer tables are bounded and swept; a
punched peer stays punched while the connection the punch opened is open."""

from __future__ import annotations

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError
from libp2p.relay.circuit_v2.dcutr import PROTOCOL_ID as DCUTR_ID
from libp2p.relay.circuit_v2.dcutr import read_dcutr_msg
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch as HolePunchMsg
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from libp2p.tools.anyio_service.context import background_trio_service
from multiaddr import Multiaddr

from peerd.daemon.config import ConfigError, loads_config
from peerd.net.dcutr import MAX_PUNCH_ADDRS, HolePunch
from peerd.net.holepunch import dcutr_upgraded
from peerd.net.transport import open_transport
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX
from tests.net.hosts import LOOPBACK, echo, host, run

FLEET = {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX}
RELAY = "/ip4/203.0.113.10/tcp/4011/p2p/12D3KooWNdD52pNh91zJwXAuLRMsaAwotPwR3zv5UUKeyPfxSZRF"
#: Where a stranger's CONNECT would send our dials: a public host nobody here runs.
BAIT = "/ip4/198.51.100.7/tcp/4001"


def test_hole_punch_is_off_unless_asked_and_needs_a_relay() -> None:
    assert loads_config({"fleet": FLEET}).network.hole_punch is False
    on = loads_config({"fleet": FLEET, "network": {"relays": [RELAY], "hole_punch": True}})
    assert on.network.hole_punch is True
    # Relays learned by address exchange are enough (learn_relays is on by default) ...
    assert loads_config({"fleet": FLEET, "network": {"hole_punch": True}}).network.hole_punch
    # ... but with learning off, no relay could ever hand over a connection to upgrade.
    with pytest.raises(ConfigError, match=r"\[network\] hole_punch: needs \[network\] relays "
                                          r"or learn_relays = true"):
        loads_config({"fleet": FLEET, "network": {"hole_punch": True, "learn_relays": False}})
    with pytest.raises(ConfigError, match=r"\[network\] hole_punch: must be true or false"):
        loads_config({"fleet": FLEET, "network": {"relays": [RELAY], "hole_punch": "yes"}})


async def _connect_msg(addrs: list[str]) -> HolePunchMsg:
    msg = HolePunchMsg(type=HolePunchMsg.CONNECT)
    msg.ObsAddrs.extend(Multiaddr(a).to_bytes() for a in addrs)
    return msg


class _AsIfRelayed(HolePunch):
    """The connection here is a direct loopback one, over which the library closes a DCUtR
    stream at once (there is nothing to upgrade); seen as relayed, it runs the exchange."""

    async def _have_direct_connection(self, peer_id: ID) -> bool:
        return False

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr],
                                  as_responder: bool = False) -> bool:
        return False  # the exchange is the point here, not the dials


def _addrs_of(h: IHost, peer: str) -> list[str]:
    try:
        return [str(x) for x in h.get_peerstore().addrs(ID.from_base58(peer))]
    except PeerStoreError:  # no entry at all: nothing stored of it
        return []


def _served(admitted: bool) -> tuple[int, bool, list[str]]:
    """B connects to A and sends a CONNECT naming BAIT over a DCUtR stream; A admits B or
    not. (A's refusals, whether B read A's CONNECT, A's peerstore addresses of B)."""
    out: list[tuple[int, bool, list[str]]] = []

    async def body() -> None:
        b_key = Ed25519PrivateKey.generate()
        async with host(key=b_key) as b:
            b_id = b.peer_id
            async with open_transport(Ed25519PrivateKey.generate(), echo, LOOPBACK,
                                      admit=lambda p: admitted and p == b_id) as a:
                punch = _AsIfRelayed(a.host, lambda p: admitted and p == b_id)
                async with background_trio_service(punch):
                    await punch.event_started.wait()
                    await b.connect(a.peer_id, [f"/ip4/127.0.0.1/tcp/{a.port}"])
                    stream = await b.host.new_stream(ID.from_base58(a.peer_id), [DCUTR_ID])
                    await write_delimited_msg(stream, await _connect_msg([BAIT]))
                    answered = False
                    with trio.move_on_after(5):
                        try:
                            reply = await read_dcutr_msg(stream, HolePunchMsg)
                            answered = reply.type == HolePunchMsg.CONNECT
                        except Exception:  # noqa: BLE001 - a reset stream: nothing answered
                            answered = False
                    await stream.reset()
                    known = _addrs_of(a.host, b_id)
                    out.append((punch.refused, answered, known))
    run(body)
    return out[0]


def test_a_non_member_dcutr_stream_is_reset_unread() -> None:
    refused, answered, known = _served(admitted=False)
    assert refused == 1
    assert not answered
    assert BAIT not in known  # its CONNECT was never read: nothing to dial


def test_a_member_dcutr_stream_is_answered() -> None:
    refused, answered, known = _served(admitted=True)
    assert refused == 0
    assert answered
    assert BAIT in known  # taken from its CONNECT, as the library does


def test_connect_addresses_are_bounded_to_tcp() -> None:
    async def body() -> None:
        async with host() as a:
            punch = HolePunch(a.host, lambda _p: True)
            raw = [Multiaddr(f"/ip4/198.51.100.{i}/tcp/4001").to_bytes() for i in range(100)]
            junk = [b"\xff\x00", Multiaddr("/ip4/198.51.100.1/udp/4001").to_bytes(),
                    Multiaddr(f"{RELAY}/p2p-circuit").to_bytes(),
                    Multiaddr("/dns4/x/tcp/1").to_bytes()]
            taken = punch._decode_observed_addrs([*junk, *raw])
            assert [str(t) for t in taken] == [f"/ip4/198.51.100.{i}/tcp/4001"
                                               for i in range(MAX_PUNCH_ADDRS)]
    run(body)


def test_tables_are_bounded_and_swept_and_punches_follow_their_connection() -> None:
    async def body() -> None:
        async with host() as a, host() as b:
            strangers = [ID.from_base58(str(p)) for p in (
                "12D3KooWNdD52pNh91zJwXAuLRMsaAwotPwR3zv5UUKeyPfxSZRF",
                "12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp")]
            punch = HolePunch(a.host, lambda _p: True, max_peers=2)
            for s in strangers:  # peers that left: their entries outlive them in the library
                punch._hole_punch_attempts[s] = 1
                punch._initiate_locks[s] = trio.Lock()
            b_id = ID.from_base58(b.peer_id)
            assert punch.tracked() == 2
            # Full: a new peer is not punched (no stream, no entry).
            assert await punch.initiate_hole_punch(b_id) is False
            assert b_id not in punch._hole_punch_attempts
            punch.sweep()
            assert punch.tracked() == 0
            # A punch's direct connection: the peer counts while it is open.
            await a.connect(b.peer_id, [f"/ip4/127.0.0.1/tcp/{b.port}"])
            punch._note(b_id)
            assert dcutr_upgraded(a.host) == frozenset({b.peer_id})
            # Another connection of b's closing (the relayed leg, 60 s after a punch) makes
            # the library forget b; the punched connection is still open: still punched.
            punch.on_peer_disconnected(b_id)
            assert b_id not in punch._direct_connections
            assert dcutr_upgraded(a.host) == frozenset({b.peer_id})
            await a.disconnect(b.peer_id)
            with trio.fail_after(5):
                while a.is_connected(b.peer_id):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            assert dcutr_upgraded(a.host) == frozenset()
            punch.sweep()
            assert punch.tracked() == 0
    run(body)
