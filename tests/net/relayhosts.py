"""Relay clients for the tests of :mod:`peerd.net.relay`: peerd transports on 127.0.0.1 that
reserve, dial circuits and use the rendezvous point with py-libp2p's own client pieces (as
benchmarks/relay_probe.py does; peerd's relay client is another module's)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service.context import background_trio_service

from peerd.net.transport import IdentityKey, Stream, Transport, TransportConfig, open_transport

SINK = TProtocol("/peerd-test/sink/1.0.0")
LOOPBACK = TransportConfig(listen_host="127.0.0.1", listen_port=0)


async def no_handler(stream: Stream) -> None:
    return None


async def read_exactly(stream: INetStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.read(min(1 << 20, n - len(buf)))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


@dataclass
class Client:
    """One host with the Circuit Relay v2 stop/client roles."""

    transport: Transport
    proto: CircuitV2Protocol
    circuits: CircuitV2Transport
    nursery: trio.Nursery

    @property
    def peer_id(self) -> ID:
        return self.transport.host.get_id()

    async def connect(self, peer: ID, addr: str) -> None:
        await self.transport.host.connect(PeerInfo(peer, [multiaddr.Multiaddr(addr)]))

    async def reserve(self, relay: ID, addr: str) -> bool:
        await self.connect(relay, addr)
        stream = await self.transport.host.new_stream(relay, [HOP_ID])
        return bool(await self.circuits.reserve(stream, relay, self.nursery))

    async def dial(self, relay: ID, addr: str, target: ID) -> None:
        circuit = multiaddr.Multiaddr(f"{addr}/p2p/{relay}/p2p-circuit/p2p/{target}")
        await self.circuits.dial(circuit)


@asynccontextmanager
async def relay_clients(n: int, keys: Sequence[IdentityKey] = ()
                        ) -> AsyncIterator[list[Client]]:
    """``n`` clients; the first ``len(keys)`` with these identities, the others fresh ones."""
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        # Cancelled after the hosts closed (the stack unwinds last in, first out): cancelled
        # before, their cleanup would raise Cancelled over the body's own exception.
        stack.callback(nursery.cancel_scope.cancel)
        out: list[Client] = []
        for i in range(n):
            key = keys[i] if i < len(keys) else os.urandom(32)
            t = await stack.enter_async_context(open_transport(key, no_handler, LOOPBACK))
            proto = CircuitV2Protocol(t.host, allow_hop=False)
            await stack.enter_async_context(background_trio_service(proto))
            await proto.event_started.wait()
            cfg = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT)
            out.append(Client(t, proto, CircuitV2Transport(t.host, proto, cfg), nursery))
        yield out
