"""Count the mDNS packets hosts put on a namespace bridge (run inside the switch namespace).

    ip netns exec SWITCH python -m benchmarks._mdnscount BRIDGE

Reads every frame of the namespace with one ``AF_PACKET`` socket and counts, per address
family, the UDP packets to or from port 5353 that *arrive* at the bridge from a host's veth
(``pkttype`` not ``PACKET_OUTGOING``, interface not the bridge itself): each packet a host
sends is counted once, not once per port the bridge floods it to. Every other frame is counted
apart (gossip's TCP, ARP, neighbour discovery) to show what the bridge carries besides. Prints
one JSON line of running totals every second, and a last one on SIGTERM. Owns nothing but its
socket; used by :mod:`benchmarks.bench_fleet`.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
MDNS_PORT = 5353
ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
UDP = 17
REPORT_EVERY_S = 1.0


def mdns_family(frame: bytes) -> str | None:
    """"ipv4" / "ipv6" for a UDP packet to or from port 5353 in an Ethernet frame, else None.
    IPv6 extension headers are not followed (mDNS packets carry none)."""
    if len(frame) < 14:
        return None
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    if ethertype == ETH_IPV4 and len(frame) >= 14 + 20:
        ihl = (frame[14] & 0x0F) * 4
        if frame[14 + 9] != UDP or len(frame) < 14 + ihl + 4:
            return None
        sport, dport = struct.unpack_from("!HH", frame, 14 + ihl)
        return "ipv4" if MDNS_PORT in (sport, dport) else None
    if ethertype == ETH_IPV6 and len(frame) >= 14 + 40 + 4:
        if frame[14 + 6] != UDP:
            return None
        sport, dport = struct.unpack_from("!HH", frame, 14 + 40)
        return "ipv6" if MDNS_PORT in (sport, dport) else None
    return None


def main() -> None:
    bridge = sys.argv[1] if len(sys.argv) > 1 else "br0"
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    counts = {"ipv4": 0, "ipv4_bytes": 0, "ipv6": 0, "ipv6_bytes": 0, "other": 0,
              "other_bytes": 0}
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    next_report = time.monotonic()
    while not stopping:
        now = time.monotonic()
        if now >= next_report:
            print(json.dumps({"t": time.time(), **counts}), flush=True)
            next_report = now + REPORT_EVERY_S
        ready, _, _ = select.select([sock], [], [], max(0.0, next_report - now))
        if not ready:
            continue
        frame, addr = sock.recvfrom(65535)
        if addr[0] == bridge or addr[2] == PACKET_OUTGOING:
            continue
        family = mdns_family(frame)
        key = family or "other"
        counts[key] += 1
        counts[f"{key}_bytes"] += len(frame)
    print(json.dumps({"t": time.time(), **counts}), flush=True)


if __name__ == "__main__":
    main()
