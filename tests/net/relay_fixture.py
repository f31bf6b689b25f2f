"""The relay of the relay client's tests: ``peerd.net.relay``'s service (the Circuit Relay v2
hop and the rendezvous point that ``peerd relay`` runs) on one plain peerd transport on
loopback, with a reservation TTL of the test's choosing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.relay import RelayLimits, RelayService, serve_relay
from peerd.net.transport import Stream, Transport, TransportConfig, open_transport


async def _refuse(stream: Stream) -> None:
    await stream.reset()  # a relay serves no gossip


@dataclass
class Relay:
    transport: Transport
    service: RelayService

    @property
    def addr(self) -> str:
        """``/ip4/…/tcp/…/p2p/<id>``: what ``[network] relays`` names."""
        return f"{self.transport.listen_addrs[0]}/p2p/{self.transport.peer_id}"


@asynccontextmanager
async def relay(*, key: Ed25519PrivateKey | None = None, host: str = "127.0.0.1",
                port: int = 0, reservation_ttl: int = 600) -> AsyncIterator[Relay]:
    cfg = TransportConfig(listen_host=host, listen_port=port)
    async with open_transport(key or Ed25519PrivateKey.generate(), _refuse, cfg) as t, \
            serve_relay(t.host, RelayLimits(reservation_ttl_s=reservation_ttl)) as service:
        yield Relay(t, service)
