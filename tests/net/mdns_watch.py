"""A browsing peerd discovery that only takes members, for namespace tests (issue 12, item 12).

Run inside a test-made namespace (never in the root one: it multicasts):
    ip netns exec NS python tests/net/mdns_watch.py --seed HEX --fleet F --member ID ...
It advertises itself (a made-up port: nothing dials it) and prints one JSON object per line:
{"event": "ready"|"peer"|"lost"|"done", ...}; it is done once every --until-lost id has
been reported lost and --expect-not-member records were ignored, or at --deadline.
"""

from __future__ import annotations

# ruff: noqa: E402  -- the clock starts before the slow imports, so "t" includes them
import time

_T0 = time.monotonic()

import argparse
import json
import sys
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.discovery import PeerHint, open_discovery
from peerd.protocol.identity import node_id_of


def emit(**fields: Any) -> None:
    print(json.dumps({**fields, "t": round(time.monotonic() - _T0, 3)}), flush=True)


async def main(args: argparse.Namespace) -> None:
    me = node_id_of(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(args.seed)))
    members = set(args.member)
    found: list[str] = []
    lost: list[str] = []
    changed = trio.Event()

    def on_peer(hint: PeerHint) -> None:
        found.append(hint.node_id)
        emit(event="peer", id=hint.node_id, addresses=list(hint.addresses))
        changed.set()

    def on_lost(node_id: str) -> None:
        lost.append(node_id)
        emit(event="lost", id=node_id)
        changed.set()

    async with open_discovery(node_id=me, fleet_id=args.fleet, port=4999, protocol_version=1,
                              on_peer=on_peer, interfaces=args.iface or None,
                              on_peer_lost=on_lost, is_member=members.__contains__) as disco:
        emit(event="ready", id=me)

        def satisfied() -> bool:
            return (set(args.until_lost) <= set(lost)
                    and disco.rejected["not_member"] >= args.expect_not_member)

        with trio.move_on_after(args.deadline):
            while not satisfied():
                changed = trio.Event()
                # Ignored records call nothing back: look at the counter now and then.
                with trio.move_on_after(0.5):
                    await changed.wait()
        rejected = dict(disco.rejected)
    emit(event="done", found=found, lost=lost, rejected=rejected)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seed", required=True, help="32-byte Ed25519 seed, hex")
    p.add_argument("--fleet", required=True)
    p.add_argument("--iface", action="append", default=[])
    p.add_argument("--member", action="append", default=[], help="a node id to take")
    p.add_argument("--until-lost", action="append", default=[],
                   help="a node id whose goodbye ends the run")
    p.add_argument("--expect-not-member", type=int, default=0,
                   help="records ignored as not members before the run ends")
    p.add_argument("--deadline", type=float, default=40.0)
    trio.run(main, p.parse_args())
    sys.exit(0)
