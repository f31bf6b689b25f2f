"""A model entry through one circuit of peerd's relay (issue 27 item 2), and its limits.

Three peerd transports on 127.0.0.1: R runs :mod:`peerd.net.relay` with the limits ``peerd
relay`` runs with (:data:`peerd.net.relay.RELAY_LIMITS`), A reserves a slot at R, B dials A
through ``…/p2p/<R>/p2p-circuit/p2p/<A>`` (py-libp2p's client pieces; Noise + Yamux end to
end) and sends A ``--repeat`` payloads of ``--bytes`` (44 MB: one weight entry of the largest
model in docs/benchmarks.md) on one stream each, over the same circuit; A checks each
byte-identical. Writes docs/reproduction/relay/relay-entry.json and docs/transport.md's
``bench:relay`` block (the limits table and the readings).

    .venv/bin/python -m benchmarks.bench_relay              # measure, write both
    .venv/bin/python -m benchmarks.bench_relay --render     # rewrite the block from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READINGS = ROOT / "docs" / "reproduction" / "relay" / "relay-entry.json"
TRANSPORT_DOC = ROOT / "docs" / "transport.md"
MARK = "relay"
CHUNK = 1 << 20

#: What each limit bounds (as peerd.net.relay.RelayLimits's comments), in table order.
THREATS: dict[str, str] = {
    "reservations": "reservations held at once: the hop's table (peer ids cost nothing)",
    "reservations_per_ip": "reservations held from one IP address: one host cannot take "
                           "every slot with fresh keys (a site behind one NAT shares one)",
    "circuits": "circuits open at once, in all (two streams and two tasks each)",
    "circuits_per_peer": "circuits open at once to one reserved peer, and from one source",
    "circuit_bytes": "bytes one circuit carries, both directions together (then reset; "
                     "the member dials a new one)",
    "circuit_duration_s": "seconds one circuit lasts (then reset)",
    "reservation_ttl_s": "seconds a reservation lasts unless refreshed",
    "registrations": "rendezvous registrations held at once, all namespaces together",
    "registrations_per_peer": "registrations one peer holds (one per namespace)",
    "registrations_per_namespace": "registrations one fleet's namespace holds",
    "registration_ttl_s": "longest registration TTL granted (longer asks are shortened)",
    "addrs_per_registration": "addresses one registration carries",
    "rendezvous_message_bytes": "largest rendezvous message read",
}


async def _measure(size: int, repeat: int) -> dict[str, Any]:
    import multiaddr
    import trio
    from libp2p.custom_types import TProtocol
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
    from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
    from libp2p.relay.circuit_v2.transport import CircuitV2Transport
    from libp2p.tools.anyio_service.context import background_trio_service

    from peerd.net.relay import serve_relay
    from peerd.net.transport import Stream, TransportConfig, open_transport

    sink_id = TProtocol("/peerd-bench/sink/1.0.0")
    cfg = TransportConfig(listen_host="127.0.0.1", listen_port=0)
    got: list[bytes] = []
    arrived = trio.Semaphore(0)

    async def no_handler(stream: Stream) -> None:
        return None

    async def sink(stream: Any) -> None:
        buf = bytearray()
        while len(buf) < size:
            chunk = await stream.read(min(CHUNK, size - len(buf)))
            if not chunk:
                break
            buf += chunk
        got.append(bytes(buf))
        await stream.write(b"ok")
        await stream.close()
        arrived.release()

    out: dict[str, Any] = {"bytes": size, "repeat": repeat, "transfers_s": [],
                           "byte_identical": []}
    with trio.fail_after(60 + 30 * repeat):
        async with open_transport(os.urandom(32), no_handler, cfg) as r, \
                serve_relay(r.host) as service, \
                open_transport(os.urandom(32), no_handler, cfg) as a, \
                open_transport(os.urandom(32), no_handler, cfg) as b, \
                trio.open_nursery() as nursery:
            protos = [CircuitV2Protocol(h.host, allow_hop=False) for h in (a, b)]
            async with background_trio_service(protos[0]), background_trio_service(protos[1]):
                client = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT)
                a_tr = CircuitV2Transport(a.host, protos[0], client)
                b_tr = CircuitV2Transport(b.host, protos[1], client)
                a.host.set_stream_handler(sink_id, sink)
                rid = r.host.get_id()
                addr = f"/ip4/127.0.0.1/tcp/{r.port}"
                t0 = time.perf_counter()
                await a.host.connect(PeerInfo(rid, [multiaddr.Multiaddr(addr)]))
                stream = await a.host.new_stream(rid, [HOP_ID])
                out["reserved"] = bool(await a_tr.reserve(stream, rid, nursery))
                await b_tr.dial(multiaddr.Multiaddr(
                    f"{addr}/p2p/{rid}/p2p-circuit/p2p/{a.host.get_id()}"))
                out["reserve_and_dial_s"] = round(time.perf_counter() - t0, 3)
                for _ in range(repeat):
                    payload = os.urandom(size)
                    got.clear()
                    t1 = time.perf_counter()
                    s = await b.host.new_stream(a.host.get_id(), [sink_id])
                    view = memoryview(payload)
                    for i in range(0, size, CHUNK):
                        await s.write(bytes(view[i:i + CHUNK]))
                    await arrived.acquire()
                    out["transfers_s"].append(round(time.perf_counter() - t1, 3))
                    out["byte_identical"].append(got[0] == payload)
                    await s.close()
                out["circuits_open"] = service.stats().circuits
                nursery.cancel_scope.cancel()
    return out


def render(r: dict[str, Any]) -> str:
    """The doc's block from one run's readings."""
    limits = r["limits"]
    med = statistics.median(r["transfers_s"])
    ok = sum(r["byte_identical"])
    lines = [
        "| limit | value | what it bounds |",
        "|---|---:|---|",
        *(f"| `{name}` | {limits[name]:,} | {THREATS[name]} |" for name in THREATS),
        "",
        f"Measured (`python -m benchmarks.bench_relay`, loopback, one circuit, the limits "
        f"above): {r['bytes']:,} bytes sent {r['repeat']} times over one circuit, "
        f"{ok}/{r['repeat']} byte-identical at the far end; median {med:.2f} s per transfer "
        f"({r['bytes'] / med / 1e6:.1f} MB/s), reserve + circuit dial "
        f"{r['reserve_and_dial_s']:.2f} s.",
    ]
    if "provenance" in r:
        from benchmarks import _provenance

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    import trio

    from benchmarks import _provenance
    from benchmarks._report import write_section
    from peerd.net.relay import RELAY_LIMITS

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bytes", type=int, default=44_000_000, help="payload per transfer")
    ap.add_argument("--repeat", type=int, default=3, help="transfers over the one circuit")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: rewrite the block from the committed readings")
    args = ap.parse_args()
    if args.render:
        write_section(MARK, render(json.loads(READINGS.read_text())), TRANSPORT_DOC)
        return
    started = _provenance.start(ap, args)
    r = trio.run(_measure, args.bytes, args.repeat)
    r["limits"] = asdict(RELAY_LIMITS)
    r["provenance"] = started.record()
    md = render(r)
    print(md)
    if not args.no_write:
        READINGS.parent.mkdir(parents=True, exist_ok=True)
        READINGS.write_text(json.dumps(r, indent=1) + "\n")
        write_section(MARK, md, TRANSPORT_DOC)


if __name__ == "__main__":
    main()
