"""Each connected peer's path and RTT read from real libp2p connections on loopback (issue 27
item 3): a direct loopback connection is ``lan`` on both ends with a measured RTT; a
connection relayed by a py-libp2p Circuit Relay v2 hop is ``relayed`` via that hop on both
ends (the listening end included, which py-libp2p labels with its own id as the relay's),
and libp2p ping runs over it."""

from __future__ import annotations

import multiaddr
import trio
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service.context import background_trio_service

from peerd.net.addrs import local_networks
from peerd.net.holepunch import dcutr_upgraded
from peerd.net.ping import Pinger, ping_ms
from peerd.node.paths import PeerPath, classify
from peerd.node.rtt import RttTable
from tests.net.hosts import host, run

#: A well-formed peer id nobody here holds: named to the pinger, never connected.
STRANGER = "12D3KooWNdD52pNh91zJwXAuLRMsaAwotPwR3zv5UUKeyPfxSZRF"


def test_loopback_connection_is_lan_with_a_measured_rtt() -> None:
    async def body() -> None:
        async with host() as a, host() as b:
            await a.connect(b.peer_id, [f"/ip4/127.0.0.1/tcp/{b.port}"])
            nets = local_networks()
            # Loopback is this host: as local as a link gets (docs/operations.md).
            out, into = a.connection_multiaddrs(b.peer_id), b.connection_multiaddrs(a.peer_id)
            assert out == [f"/ip4/127.0.0.1/tcp/{b.port}"]
            assert len(into) == 1
            assert into[0].startswith("/ip4/127.0.0.1/tcp/")
            assert classify(out, nets) == PeerPath("lan")
            assert classify(into, nets) == PeerPath("lan")
            samples = [await ping_ms(a.host, b.peer_id) for _ in range(5)]
            samples.append(await ping_ms(b.host, a.peer_id))  # served by default both ways
            assert all(0.0 < s < 1000.0 for s in samples), samples
            # The pinger fills the table on its schedule, without dialling anyone.
            table = RttTable(interval_s=0.2)
            pinger = Pinger(a, lambda: [b.peer_id, STRANGER], table)
            async with trio.open_nursery() as n:
                n.start_soon(pinger.run, 0.05)
                with trio.fail_after(10):
                    while (r := table.get(b.peer_id)) is None or r.last_ms is None:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                    await trio.sleep(0.6)  # a few intervals: more samples
                n.cancel_scope.cancel()
            r = table.get(b.peer_id)
            assert r is not None
            assert r.smoothed_ms is not None
            assert r.smoothed_ms > 0.0
            assert r.failures == 0
            # The unconnected id was never pinged, nor dialled.
            assert a.connected_peers() == [b.peer_id]
    run(body)


def test_relayed_connection_names_its_relay_on_both_ends() -> None:
    limits = RelayLimits(duration=600, data=8 << 20, max_circuit_conns=8, max_reservations=8,
                         reservation_ttl=600)

    async def body() -> None:
        async with host() as r, host() as a, host() as b:
            rh, ah, bh = r.host, a.host, b.host
            protos = [CircuitV2Protocol(rh, limits=limits, allow_hop=True),
                      CircuitV2Protocol(ah, limits=limits, allow_hop=False),
                      CircuitV2Protocol(bh, limits=limits, allow_hop=False)]
            async with background_trio_service(protos[0]), \
                    background_trio_service(protos[1]), \
                    background_trio_service(protos[2]), trio.open_nursery() as nursery:
                for p in protos:
                    await p.event_started.wait()
                cfg = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT, limits=limits)
                a_tr = CircuitV2Transport(ah, protos[1], cfg)
                b_tr = CircuitV2Transport(bh, protos[2], cfg)
                await ah.connect(PeerInfo(rh.get_id(), [
                    multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{r.port}")]))
                stream = await ah.new_stream(rh.get_id(), [HOP_ID])
                assert await a_tr.reserve(stream, rh.get_id(), nursery)
                await b_tr.dial(multiaddr.Multiaddr(
                    f"/ip4/127.0.0.1/tcp/{r.port}/p2p/{r.peer_id}/p2p-circuit/p2p/{a.peer_id}"))
                nets = local_networks()
                dialled = b.connection_multiaddrs(a.peer_id)
                accepted = a.connection_multiaddrs(b.peer_id)
                assert dialled == [f"/p2p/{r.peer_id}/p2p-circuit/p2p/{a.peer_id}"]
                assert accepted == [f"/p2p/{r.peer_id}/p2p-circuit/p2p/{b.peer_id}"]
                assert classify(dialled, nets) == PeerPath("relayed", r.peer_id)
                # Even a peer mDNS found: the path is what the connection runs over.
                assert classify(accepted, nets, mdns=True) == PeerPath("relayed", r.peer_id)
                # Both ends reach the relay itself directly, over loopback.
                assert classify(b.connection_multiaddrs(r.peer_id), nets) == PeerPath("lan")
                rtt = await ping_ms(bh, a.peer_id)
                assert rtt > 0.0
                nursery.cancel_scope.cancel()
    run(body)


def test_a_connection_dcutr_upgraded_is_hole_punched() -> None:
    """py-libp2p's DCUtR on loopback: its step 0 (a plain dial of the address identify gave)
    upgrades the relayed connection; the peer it upgraded is reported hole-punched, the
    relay leg is still listed but the direct connection wins."""
    limits = RelayLimits(duration=600, data=8 << 20, max_circuit_conns=8, max_reservations=8,
                         reservation_ttl=600)

    async def body() -> None:
        async with host() as r, host() as a, host() as b:
            rh, ah, bh = r.host, a.host, b.host
            protos = [CircuitV2Protocol(rh, limits=limits, allow_hop=True),
                      CircuitV2Protocol(ah, limits=limits, allow_hop=False),
                      CircuitV2Protocol(bh, limits=limits, allow_hop=False)]
            a_dcutr, b_dcutr = DCUtRProtocol(ah), DCUtRProtocol(bh)
            assert dcutr_upgraded(ah) == frozenset()
            async with background_trio_service(protos[0]), \
                    background_trio_service(protos[1]), \
                    background_trio_service(protos[2]), \
                    background_trio_service(a_dcutr), background_trio_service(b_dcutr), \
                    trio.open_nursery() as nursery:
                for p in protos:
                    await p.event_started.wait()
                for d in (a_dcutr, b_dcutr):
                    await d.event_started.wait()
                cfg = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT, limits=limits)
                a_tr = CircuitV2Transport(ah, protos[1], cfg)
                b_tr = CircuitV2Transport(bh, protos[2], cfg)
                await ah.connect(PeerInfo(rh.get_id(), [
                    multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{r.port}")]))
                stream = await ah.new_stream(rh.get_id(), [HOP_ID])
                assert await a_tr.reserve(stream, rh.get_id(), nursery)
                await b_tr.dial(multiaddr.Multiaddr(
                    f"/ip4/127.0.0.1/tcp/{r.port}/p2p/{r.peer_id}/p2p-circuit/p2p/{a.peer_id}"))
                nets = local_networks()
                assert classify(a.connection_multiaddrs(b.peer_id), nets,
                                hole_punched=b.peer_id in dcutr_upgraded(ah)) == \
                    PeerPath("relayed", r.peer_id)
                with trio.fail_after(20):
                    while b.peer_id not in dcutr_upgraded(ah) \
                            and a.peer_id not in dcutr_upgraded(bh):  # noqa: ASYNC110
                        await trio.sleep(0.1)
                upgraded, other, t = (a, b, ah) if b.peer_id in dcutr_upgraded(ah) \
                    else (b, a, bh)
                addrs = upgraded.connection_multiaddrs(other.peer_id)
                assert any("/p2p-circuit" in x for x in addrs)
                assert any("/p2p-circuit" not in x for x in addrs)
                assert classify(addrs, nets, hole_punched=other.peer_id in dcutr_upgraded(t)) \
                    == PeerPath("hole-punched")
                assert classify(addrs, nets) == PeerPath("lan")  # without DCUtR's word
                nursery.cancel_scope.cancel()
    run(body)
