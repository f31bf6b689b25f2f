"""The soak's outsider (tests/integration/soak.py): one process inside a test namespace on the
fleet's bridge that plays every hostile party of the soak, one command at a time.

Run it inside a test-made namespace only (never the root one: it multicasts):
    ip netns exec NS python -m tests.integration.soak_agent --fleet-id HEX
It reads one JSON command per line on stdin and answers one JSON line on stdout:

- ``probe``: a stranger (fresh key, not a member) opens sessions: a Hello claiming a far
  newer manifest (the daemon must cut it, items 5/6), then an offer (refused: not a member).
- ``flood``: ``count`` strangers complete Noise + Yamux and hold on for ``hold_s``.
- ``garbage``: a member's key sends garbage: a flipped payload byte, a transposed weight, a
  non-finite tensor, a version far beyond what time allows, a malformed frame, an oversize
  length prefix. Every one must be refused by reason; the member is never flagged.
- ``mdns_wave``: ``count`` made-up instances of the fleet's mDNS service (fleet id right,
  node ids of nobody) multicast as unsolicited answers, then their goodbyes (TTL 0).

It owns nothing of the daemons; it only speaks to them over the network.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from zeroconf import ServiceInfo, const
from zeroconf._protocol.outgoing import DNSOutgoing

from peerd.learn.tasks import load_task
from peerd.net.discovery import SERVICE_TYPE
from peerd.net.txtrecord import build_txt
from peerd.protocol.identity import node_id_of
from tests.integration.hostile import Reply, Target, corrupt, hostile_peer, make_entry
from tests.net.strangers import strangers

#: A manifest seq no fleet reaches: the stranger claims to hold a newer manifest (item 6).
HUGE_SEQ = 1_000_000
#: Instances per mDNS packet: 4 records each (PTR, SRV, TXT, A) stay under one MTU.
PER_PACKET = 6
MDNS_GROUP = ("224.0.0.251", 5353)


def _reply(r: Reply) -> dict[str, Any]:
    # wanted: how many offered entries the daemon asked for (0: refused from the digest line).
    return {"hello": r.hello is not None, "wanted": None if r.want is None else len(r.want.items),
            "error": None if r.error is None else r.error.code, "closed": r.closed}


def _session(fn: Callable[[], Reply]) -> dict[str, Any]:
    try:
        return _reply(fn())
    except Exception as exc:  # noqa: BLE001 - a cut session is an outcome, reported
        return {"failed": type(exc).__name__}


def probe(args: argparse.Namespace, cmd: dict[str, Any]) -> dict[str, Any]:
    key = Ed25519PrivateKey.generate()
    target = Target(cmd["target"], cmd["addr"])
    out: list[dict[str, Any]] = []
    with hostile_peer(key, args.fleet_id, HUGE_SEQ, target) as h:
        t0 = time.monotonic()
        out.append({**_session(lambda: h.offer([])), "s": round(time.monotonic() - t0, 1)})
    with hostile_peer(key, args.fleet_id, cmd["seq"], target) as h:
        out.append(_session(lambda: h.offer([])))
    return {"sessions": out}


def flood(cmd: dict[str, Any]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with strangers(cmd["target"], cmd["addr"], cmd["count"]) as held:
            connected = sum(s.conn is not None for s in held)
            await trio.sleep(cmd["hold_s"])
            return {"connected": connected, "closed_by_target":
                    sum(s.closed_by_target for s in held)}

    return trio.run(main)


def garbage(args: argparse.Namespace, cmd: dict[str, Any]) -> dict[str, Any]:
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(cmd["key"]))
    fid = args.fleet_id
    params = load_task(cmd.get("task", "digits")).model().state_dict()
    weight = next(k for k, v in params.items() if v.dim() == 2 and v.shape[0] != v.shape[1])
    reshaped = {**params, weight: params[weight].reshape(params[weight].shape[::-1])}
    nonfinite = {**params, weight: torch.full_like(params[weight], float("nan"))}
    # Versions above anything this key ever signed, within what time allows (item 14).
    v = cmd["version"]
    now = time.time()
    target = Target(cmd["target"], cmd["addr"])
    out: dict[str, Any] = {}
    with hostile_peer(key, fid, cmd["seq"], target) as h:
        out["corrupt"] = _session(lambda: h.offer([corrupt(make_entry(key, fid, params, v, now))]))
        out["shape"] = _session(lambda: h.offer([make_entry(key, fid, reshaped, v + 1, now)]))
        out["nonfinite"] = _session(lambda: h.offer([make_entry(key, fid, nonfinite, v + 2,
                                                                   now)]))
        out["huge_version"] = _session(lambda: h.offer([make_entry(key, fid, params, 2**52,
                                                                      now)]))
        out["malformed"] = _session(lambda: h.raw_frames([os.urandom(64)]))
        out["oversize"] = _session(h.oversize_prefix)
    return out


def mdns_wave(args: argparse.Namespace, cmd: dict[str, Any]) -> dict[str, Any]:
    """Unsolicited answers for ``count`` made-up instances, then their goodbyes."""
    fleet_hex, count, iface_ip = cmd["fleet"], cmd["count"], cmd["iface_ip"]
    rng = random.Random(cmd.get("seed", 0))
    infos = []
    for i in range(count):
        fake = node_id_of(Ed25519PrivateKey.from_private_bytes(rng.randbytes(32)))
        addr = f"10.{rng.randrange(1, 250)}.{rng.randrange(250)}.{rng.randrange(1, 250)}"
        infos.append(ServiceInfo(
            SERVICE_TYPE, f"fake{i}-{fake[-8:]}.{SERVICE_TYPE}", port=4011,
            properties=build_txt(fake, fleet_hex, 4011, 1), server=f"fake{i}.local.",
            parsed_addresses=[addr]))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(iface_ip))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
    sent = 0

    def send(ttl: int | None) -> None:
        nonlocal sent
        for start in range(0, len(infos), PER_PACKET):
            out = DNSOutgoing(const._FLAGS_QR_RESPONSE | const._FLAGS_AA)
            for info in infos[start:start + PER_PACKET]:
                records = [info.dns_pointer(override_ttl=ttl),
                           info.dns_service(override_ttl=ttl),
                           info.dns_text(override_ttl=ttl),
                           *info.dns_addresses(override_ttl=ttl)]
                for r in records:
                    out.add_answer_at_time(r, 0)
            for packet in out.packets():
                sock.sendto(packet, MDNS_GROUP)
                sent += 1
            time.sleep(0.002)  # a burst, not a single datagram storm the bridge drops

    t0 = time.monotonic()
    send(None)
    time.sleep(cmd.get("hold_s", 5.0))
    send(0)  # goodbyes
    sock.close()
    return {"instances": count, "packets": sent, "s": round(time.monotonic() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fleet-id", required=True, type=bytes.fromhex)
    args = p.parse_args()
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        t0 = time.monotonic()
        kind = cmd["cmd"]
        try:
            if kind == "probe":
                result = probe(args, cmd)
            elif kind == "flood":
                result = flood(cmd)
            elif kind == "garbage":
                result = garbage(args, cmd)
            elif kind == "mdns_wave":
                result = mdns_wave(args, cmd)
            else:
                result = {"error": f"unknown command {kind}"}
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which fails the run
            result = {"error": repr(exc)}
        print(json.dumps({"cmd": kind, "wall_s": round(time.monotonic() - t0, 1), **result}),
              flush=True)


if __name__ == "__main__":
    main()
