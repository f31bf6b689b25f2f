"""AutoNAT v1 (issue 27 item 3): the server of peerd.net.autonat, the verdict rule and client
of peerd.net.reachability, and the relay client's hook, on loopback. The namespace test, a
node behind a NAT router against one on the public segment, is test_autonat_netns.py."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

import multiaddr
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID, AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from peerd.net import reachability as reach_mod
from peerd.net.autonat import AutoNATLimits, AutoNATServer, RateTable, dialback_addrs
from peerd.net.reachability import Reachability, Verdict, verdict
from peerd.net.relayclient import RelayClient
from peerd.net.transport import Stream, Transport, open_transport
from tests.net.hosts import LOOPBACK, run
from tests.net.relay_fixture import relay
from tests.net.relayhosts import relay_clients
from tests.node.fleet import FLEET


async def _nothing(stream: Stream) -> None:
    await stream.reset()


def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def dial_request(t: Transport, server: str, addrs: list[str], *,
                       peer: bytes | None = None) -> Message:
    """One raw DIAL from ``t`` to ``server`` (``…/p2p/ID``) advertising ``addrs``."""
    head, _, sid = server.rpartition("/p2p/")
    if not t.is_connected(sid):
        await t.connect(sid, [head])
    req = Message(type=Message.DIAL)
    req.dial.peer.id = peer if peer is not None else t.host.get_id().to_bytes()
    for a in addrs:
        req.dial.peer.addrs.append(multiaddr.Multiaddr(a).to_bytes())
    stream = await t.host.new_stream(ID.from_base58(sid), [AUTONAT_PROTOCOL_ID])
    await stream.write(encode_varint_prefixed(req.SerializeToString()))
    raw = await read_varint_prefixed_bytes_limited(stream, 4096)
    await stream.close()
    answer = Message()
    answer.ParseFromString(raw)
    return answer


# ---------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(("answers", "servers", "expected"), [
    ([], 1, Verdict.UNKNOWN),
    ([True], 1, Verdict.PUBLIC),  # one relay: its answer decides
    ([False], 1, Verdict.PRIVATE),
    ([True], 2, Verdict.UNKNOWN),  # two relays: both must agree
    ([True, True], 2, Verdict.PUBLIC),
    ([True, False], 2, Verdict.UNKNOWN),
    ([False, False], 2, Verdict.PRIVATE),
    ([True, True, True], 6, Verdict.UNKNOWN),  # many: the spec's more than three
    ([True] * 4, 6, Verdict.PUBLIC),
    ([True] * 5 + [False], 6, Verdict.UNKNOWN),  # public needs no dissent
    ([False] * 4 + [True], 6, Verdict.PRIVATE),
])
def test_the_verdict_rule(answers: list[bool], servers: int, expected: Verdict) -> None:
    assert verdict(answers, servers) is expected


def test_the_dialback_addresses_are_the_observed_ip_only() -> None:
    raw = [multiaddr.Multiaddr(a).to_bytes() for a in (
        "/ip4/10.0.0.5/tcp/4001", "/ip4/10.0.0.5/tcp/4001/p2p/"
        "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA",
        "/ip4/192.0.2.9/tcp/4002", "/dns4/example.com/tcp/4003",
        "/ip4/192.0.2.9/udp/4004/quic-v1", "/ip4/10.0.0.5/tcp/4005", "/ip4/10.0.0.5/tcp/4006",
        "/ip4/10.0.0.5/tcp/4007")] + [b"\xff junk"]
    assert dialback_addrs(raw, "203.0.113.7", 3) == [
        "/ip4/203.0.113.7/tcp/4001", "/ip4/203.0.113.7/tcp/4002", "/ip4/203.0.113.7/tcp/4005"]
    assert dialback_addrs(raw, "2001:db8::1", 1) == ["/ip6/2001:db8::1/tcp/4001"]


def test_the_rate_table_is_bounded_in_keys_and_rate() -> None:
    now = [0.0]
    table = RateTable(2, 10.0, 3, lambda: now[0])
    assert [table.take("a") for _ in range(3)] == [True, True, False]
    assert [table.take("b"), table.take("c")] == [True, True]
    assert not table.take("d")  # three keys inside their window: no room
    assert len(table) == 3
    now[0] = 11.0
    assert table.take("d")  # the old ones pruned
    assert len(table) == 1
    assert table.take("a")


def test_a_reachability_interval_out_of_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        Reachability(None, [], interval_s=1.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- the server


def test_the_librarys_server_answers_ok_for_a_port_where_nothing_listens() -> None:
    """py-libp2p 0.8.1's AutoNATService dials back with host.connect, which reuses the
    connection the request came on: it reaches 'us' at a closed port. Why peerd serves its
    own (peerd.net.autonat); when this fails, the library was fixed."""
    async def body() -> None:
        async with open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as srv, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as cli:
            AutoNATService(srv.host, serve=True)  # type: ignore[arg-type]
            server = f"{srv.listen_addrs[0]}/p2p/{srv.peer_id}"
            answer = await dial_request(cli, server, [f"/ip4/127.0.0.1/tcp/{closed_port()}"])
            assert answer.dialResponse.status == Message.OK

    run(body)


def test_ours_dials_back_on_a_fresh_connection() -> None:
    async def body() -> None:
        async with open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as srv, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as cli:
            server = AutoNATServer(srv.host, AutoNATLimits(per_peer=2, failure_delay_s=1.0))
            server.install()
            addr = f"{srv.listen_addrs[0]}/p2p/{srv.peer_id}"
            t0 = trio.current_time()
            closed = await dial_request(cli, addr, [f"/ip4/127.0.0.1/tcp/{closed_port()}"])
            assert closed.dialResponse.status == Message.E_DIAL_ERROR
            assert trio.current_time() - t0 >= 1.0  # refused at once, answered after the delay
            ok = await dial_request(cli, addr, list(cli.listen_addrs))
            assert ok.dialResponse.status == Message.OK
            assert str(multiaddr.Multiaddr(ok.dialResponse.addr)) == cli.listen_addrs[0]
            # The dial-back closed after Noise: the swarm never held a second connection.
            assert cli.connection_count(srv.peer_id) == 1
            over = await dial_request(cli, addr, list(cli.listen_addrs))
            assert over.dialResponse.status == Message.E_DIAL_REFUSED  # 3rd in the window
            assert server.stats.answered_ok == 1
            assert server.stats.answered_error == 1
            assert server.stats.refused == 1

    run(body)


def test_ours_refuses_another_peers_id_and_requests_beyond_its_dials() -> None:
    gate = trio.Event()

    async def slow(peer: ID, addr: str, timeout_s: float) -> bool:
        await gate.wait()
        return True

    async def body() -> None:
        async with open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as srv, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as a, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as b:
            AutoNATServer(srv.host, AutoNATLimits(dials=1), dial=slow).install()
            addr = f"{srv.listen_addrs[0]}/p2p/{srv.peer_id}"
            other = await dial_request(a, addr, list(a.listen_addrs),
                                       peer=b.host.get_id().to_bytes())
            assert other.dialResponse.status == Message.E_BAD_REQUEST
            got: list[Message] = []
            async with trio.open_nursery() as nursery:
                async def first() -> None:
                    got.append(await dial_request(a, addr, list(a.listen_addrs)))
                nursery.start_soon(first)
                await trio.sleep(0.5)  # a's dial-back holds the one slot
                busy = await dial_request(b, addr, list(b.listen_addrs))
                assert busy.dialResponse.status == Message.E_DIAL_REFUSED
                assert busy.dialResponse.statusText == "busy"
                gate.set()
            assert got[0].dialResponse.status == Message.OK

    run(body)


def test_ours_refuses_a_request_over_a_relayed_connection() -> None:
    """The IP seen there is the relay's: a dial-back would go to the relay's address."""
    async def body() -> None:
        async with relay() as r, relay_clients(2) as (s, c):
            server = AutoNATServer(s.transport.host)
            server.install()
            rid, head = r.transport.host.get_id(), r.transport.listen_addrs[0]
            assert await s.reserve(rid, head)
            await c.connect(rid, head)
            await c.dial(rid, head, s.peer_id)
            assert c.transport.is_connected(str(s.peer_id))  # through the relay only
            answer = await dial_request(c.transport, f"/p2p/{s.peer_id}",
                                        list(c.transport.listen_addrs))
            assert answer.dialResponse.status == Message.E_DIAL_REFUSED
            assert answer.dialResponse.statusText == "no dial-back over a relayed connection"
            assert server.stats.refused == 1

    run(body)


# ---------------------------------------------------------------------------- the client


def _against(dial: Callable[[ID, str, float], Awaitable[bool]] | None,
             expected: Verdict) -> None:
    async def body() -> None:
        async with relay() as r, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as t:
            if dial is not None:
                r.service.autonat._dial = dial
                r.service.autonat.limits = AutoNATLimits(failure_delay_s=0.01)
            changes: list[Verdict] = []
            reach = Reachability(t, [r.addr], on_change=changes.append)
            assert reach.needs_relay()
            assert await reach.check() is expected
            assert changes == [expected]
            snap = reach.snapshot()
            assert (snap.reached, snap.not_reached) == \
                ((1, 0) if expected is Verdict.PUBLIC else (0, 1))
            assert reach.needs_relay() is (expected is not Verdict.PUBLIC)

    run(body)


def test_a_node_the_relay_reaches_is_public() -> None:
    _against(None, Verdict.PUBLIC)


def test_a_node_the_relay_cannot_reach_is_private() -> None:
    async def unreachable(peer: ID, addr: str, timeout_s: float) -> bool:
        return False

    _against(unreachable, Verdict.PRIVATE)


def test_a_refusal_is_no_verdict() -> None:
    async def body() -> None:
        async with relay() as r, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as t:
            r.service.autonat.peers = RateTable(0 + 1, 60.0, 1, trio.current_time)
            r.service.autonat.peers.take(t.peer_id)  # its one request already spent
            reach = Reachability(t, [r.addr])
            assert await reach.check() is Verdict.UNKNOWN
            assert "too many requests" in (reach.snapshot().last_error or "")

    run(body)


def test_an_address_change_clears_the_answers_and_checks_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reach_mod, "WATCH_S", 0.05)

    async def body() -> None:
        async with relay() as r, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as t:
            reach = Reachability(t, [r.addr], interval_s=3600.0)
            checks: list[float] = []
            real = reach.check

            async def counted() -> Verdict:
                checks.append(trio.current_time())
                return await real()

            reach.check = counted  # type: ignore[method-assign]
            addrs = [list(t.listen_addrs)]
            monkeypatch.setattr(type(t), "listen_addrs", property(lambda _: addrs[0]))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reach.run)
                await reach.checked.wait()
                assert reach.verdict is Verdict.PUBLIC
                assert len(checks) == 1
                addrs[0] = [*addrs[0], "/ip4/127.0.0.2/tcp/1"]
                with trio.fail_after(5):
                    while len(checks) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

    run(body)


# ---------------------------------------------------------------------------- the hook


def test_a_public_node_holds_no_reservation_and_a_private_one_does() -> None:
    async def body() -> None:
        async with relay() as r, \
                open_transport(Ed25519PrivateKey.generate(), _nothing, LOOPBACK) as t, \
                trio.open_nursery() as nursery:
            needed = [False]
            client = RelayClient(t, [r.addr], FLEET, is_member=lambda _: True,
                                 on_found=lambda *_: None, discover_interval_s=0.2,
                                 needs_reservation=lambda: needed[0])
            nursery.start_soon(client.run)
            await client.started.wait()
            await trio.sleep(1.5)
            assert client.circuit_addrs() == ()
            assert client.states()[0].reservations == 0
            assert t.is_connected(r.transport.peer_id)  # connected, for DISCOVER
            needed[0] = True  # e.g. the verdict went private
            with trio.fail_after(10):
                while not client.circuit_addrs():  # noqa: ASYNC110
                    await trio.sleep(0.05)
            needed[0] = False  # public again: the circuit leaves the address record
            with trio.fail_after(5):
                while client.circuit_addrs():  # noqa: ASYNC110
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    run(body)
