"""A tiny peerd node for namespace tests: advertise + browse, optionally dial what it finds.

Run inside a test-made namespace (never in the root one: it multicasts):
    ip netns exec NS python tests/net/mdns_node.py --seed HEX --fleet F ...
Prints one JSON object per line: {"event": "ready"|"peer"|"exchanged"|"done", ...}.
"""

from __future__ import annotations

# ruff: noqa: E402  -- the clock starts before the slow imports, so "t" includes them
import time

_T0 = time.monotonic()

import argparse
import dataclasses
import json
import sys
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.discovery import PeerHint, open_discovery
from peerd.net.transport import (
    Stream,
    TransportConfig,
    TransportError,
    open_transport,
    read_frame,
    write_frame,
)


def emit(**fields: Any) -> None:
    """One JSON line; ``t`` is seconds since this process started (imports included)."""
    print(json.dumps({**fields, "t": round(time.monotonic() - _T0, 3)}), flush=True)


async def echo(stream: Stream) -> None:
    await write_frame(stream, await read_frame(stream, 1024))


async def main(args: argparse.Namespace) -> None:
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(args.seed))
    found: dict[str, PeerHint] = {}
    exchanged: set[str] = set()
    #: Peers seen (and, with --dial, reached) at the --expect-address.
    at_address: set[str] = set()
    reached_at_address: set[str] = set()
    changed = trio.Event()

    async with open_transport(key, echo, TransportConfig(listen_host="0.0.0.0")) as t:

        async def exchange(hint: PeerHint, via: str | None = None) -> None:
            try:
                if via is not None:  # this address only, on a connection of its own
                    await t.disconnect(hint.node_id)
                async with t.open_stream(hint.node_id, hint.multiaddrs) as s:
                    await write_frame(s, b"hello " + t.peer_id.encode())
                    reply = await read_frame(s, 1024)
                # s.peer_id is what the Noise handshake proved, not what mDNS claimed.
                emit(event="exchanged", peer=hint.node_id, proven=s.peer_id,
                     ok=bytes(reply) == b"hello " + t.peer_id.encode(),
                     **({} if via is None else {"via": via}))
                (exchanged if via is None else reached_at_address).add(hint.node_id)
            except TransportError as e:
                emit(event="dial_error", peer=hint.node_id, error=str(e))
            changed.set()

        async with trio.open_nursery() as nursery:

            def on_peer(hint: PeerHint) -> None:
                first = hint.node_id not in found
                found[hint.node_id] = hint
                emit(event="peer", id=hint.node_id, fleet=hint.fleet_id,
                     addresses=list(hint.addresses), port=hint.port)
                if args.dial and first:
                    nursery.start_soon(exchange, hint)
                new = args.expect_address
                if new in hint.addresses and hint.node_id not in at_address:
                    at_address.add(hint.node_id)
                    if args.dial:
                        nursery.start_soon(exchange, dataclasses.replace(
                            hint, addresses=(new,)), new)
                changed.set()

            def satisfied() -> bool:
                if len(found) < args.expect:
                    return False
                if args.expect_address and not (reached_at_address if args.dial
                                                 else at_address):
                    return False
                return not args.dial or len(exchanged) >= args.expect

            async with open_discovery(
                node_id=t.peer_id, fleet_id=args.fleet, port=t.port, protocol_version=1,
                on_peer=on_peer, interfaces=args.iface or None,
            ) as disco:
                emit(event="ready", id=t.peer_id, port=t.port)
                with trio.move_on_after(args.deadline):
                    while not satisfied():
                        changed = trio.Event()
                        await changed.wait()
                    if args.until_eof:  # stay until the test closes our stdin
                        await trio.to_thread.run_sync(  # type: ignore[call-arg]
                            sys.stdin.read, abandon_on_cancel=True
                        )
                await trio.sleep(args.linger)
                rejected = dict(disco.rejected)
            nursery.cancel_scope.cancel()
    emit(event="done", found=sorted(found), rejected=rejected,
         exchanged=sorted(exchanged))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seed", required=True, help="32-byte Ed25519 seed, hex")
    p.add_argument("--fleet", required=True)
    p.add_argument("--iface", action="append", default=[])
    p.add_argument("--expect", type=int, default=0, help="peers to find before lingering")
    p.add_argument("--dial", action="store_true", help="open a stream to each peer found")
    p.add_argument("--expect-address", default=None,
                   help="also wait for a peer at this address (and reach it there, with --dial)")
    p.add_argument("--linger", type=float, default=0.0, help="seconds to stay after that")
    p.add_argument("--until-eof", action="store_true", help="then wait for stdin to close")
    p.add_argument("--deadline", type=float, default=20.0)
    trio.run(main, p.parse_args())
    sys.exit(0)
