"""A stand-in relay for the relay client's tests: py-libp2p's Circuit Relay v2 hop
(``CircuitV2Protocol(allow_hop=True)``) and its ``RendezvousService`` on one plain peerd
transport, as benchmarks/relay_probe.py runs them. The relay server of issue 27 item 2
(``peerd relay``, ``peerd.net.relay``) is built apart; once it lands, these tests can run
against it instead by replacing :func:`relay`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.discovery.rendezvous.service import RendezvousService
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.tools.anyio_service.context import background_trio_service

from peerd.net.transport import Stream, Transport, TransportConfig, open_transport


async def _refuse(stream: Stream) -> None:
    await stream.reset()  # a relay serves no gossip


@dataclass
class Relay:
    transport: Transport
    rendezvous: RendezvousService

    @property
    def addr(self) -> str:
        """``/ip4/…/tcp/…/p2p/<id>``: what ``[network] relays`` names."""
        return f"{self.transport.listen_addrs[0]}/p2p/{self.transport.peer_id}"


@asynccontextmanager
async def relay(*, key: Ed25519PrivateKey | None = None, host: str = "127.0.0.1",
                port: int = 0, reservation_ttl: int = 600) -> AsyncIterator[Relay]:
    limits = RelayLimits(duration=600, data=256 << 20, max_circuit_conns=16,
                         max_reservations=16, reservation_ttl=reservation_ttl)
    cfg = TransportConfig(listen_host=host, listen_port=port)
    async with open_transport(key or Ed25519PrivateKey.generate(), _refuse, cfg) as t:
        hop = CircuitV2Protocol(t.host, limits=limits, allow_hop=True)
        service = RendezvousService(t.host)
        async with background_trio_service(hop):
            await hop.event_started.wait()
            yield Relay(t, service)
            await trio.lowlevel.checkpoint()
