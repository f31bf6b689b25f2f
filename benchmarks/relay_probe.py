"""Probe: does py-libp2p 0.8.1's Circuit Relay v2 carry a relayed connection end to end?

Three hosts on 127.0.0.1 built by :func:`peerd.net.transport.open_transport` (TCP + Noise +
Yamux, peerd's mends): R runs the hop service, A reserves a slot at R, B dials A through
``/ip4/127.0.0.1/tcp/<R>/p2p/<R>/p2p-circuit/p2p/<A>``, Noise + Yamux are negotiated over the
relayed stream, and B sends A 1 MB on a test protocol and reads it back. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time

import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service.context import background_trio_service

from peerd.net.transport import TransportConfig, open_transport

ECHO = TProtocol("/peerd-probe/echo/1.0.0")
SIZE = 1 << 20


async def _no_handler(stream: object) -> None:
    return None


async def _read_exactly(stream, n: int) -> bytes:  # type: ignore[no-untyped-def]
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.read(min(65536, n - len(buf)))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


async def probe() -> dict[str, object]:
    cfg = TransportConfig(listen_host="127.0.0.1", listen_port=0)
    limits = RelayLimits(duration=600, data=64 << 20, max_circuit_conns=8, max_reservations=8,
                         reservation_ttl=600)
    out: dict[str, object] = {}
    with trio.fail_after(60):
        return await _run(cfg, limits, out)


async def _run(cfg: TransportConfig, limits: RelayLimits,
               out: dict[str, object]) -> dict[str, object]:
    async with open_transport(os.urandom(32), _no_handler, cfg) as r, \
            open_transport(os.urandom(32), _no_handler, cfg) as a, \
            open_transport(os.urandom(32), _no_handler, cfg) as b:
        rh, ah, bh = r.host, a.host, b.host
        r_proto = CircuitV2Protocol(rh, limits=limits, allow_hop=True)
        a_proto = CircuitV2Protocol(ah, limits=limits, allow_hop=False)
        b_proto = CircuitV2Protocol(bh, limits=limits, allow_hop=False)

        async def echo(stream):  # type: ignore[no-untyped-def]
            data = await _read_exactly(stream, SIZE)
            await stream.write(data)
            await stream.close()

        ah.set_stream_handler(ECHO, echo)
        async with background_trio_service(r_proto), background_trio_service(a_proto), \
                background_trio_service(b_proto), trio.open_nursery() as nursery:
            for p in (r_proto, a_proto, b_proto):
                await p.event_started.wait()
            client_cfg = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT, limits=limits)
            a_tr = CircuitV2Transport(ah, a_proto, client_cfg)
            b_tr = CircuitV2Transport(bh, b_proto, client_cfg)
            r_addr = f"/ip4/127.0.0.1/tcp/{r.port}/p2p/{rh.get_id()}"
            r_info = PeerInfo(rh.get_id(), [multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{r.port}")])
            t0 = time.perf_counter()
            await ah.connect(r_info)
            stream = await ah.new_stream(rh.get_id(), [HOP_ID])
            out["reserved"] = await a_tr.reserve(stream, rh.get_id(), nursery)
            out["reserve_s"] = round(time.perf_counter() - t0, 3)
            circuit = multiaddr.Multiaddr(f"{r_addr}/p2p-circuit/p2p/{ah.get_id()}")
            out["circuit"] = str(circuit)
            t1 = time.perf_counter()
            conn = await b_tr.dial(circuit)
            out["dial_s"] = round(time.perf_counter() - t1, 3)
            out["conn"] = type(conn).__name__
            # Relayed, not direct: B was never told an address of A but the circuit.
            out["b_to_a_conns"] = len(bh.get_network().connections.get(ah.get_id(), []))
            out["relayed"] = "p2p-circuit" in str(conn.get_transport_addresses())
            t2 = time.perf_counter()
            s = await bh.new_stream(ah.get_id(), [ECHO])
            payload = os.urandom(SIZE)
            await s.write(payload)
            back = await _read_exactly(s, SIZE)
            out["exchange_s"] = round(time.perf_counter() - t2, 3)
            out["echo_ok"] = back == payload
            out["echo_len"] = len(back)
            nursery.cancel_scope.cancel()
    return out


def main() -> None:
    res = trio.run(probe)
    print(json.dumps(res))
    sys.exit(0 if res.get("echo_ok") else 1)


if __name__ == "__main__":
    main()
