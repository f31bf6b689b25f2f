"""Captures the A records of mDNS responses on the wire, for namespace tests (issue 27 item 6).

Run inside a test-made namespace (never in the root one):
    ip netns exec NS python tests/net/mdns_capture.py --address IP --seconds S
It joins 224.0.0.251 on ``--address``, prints {"event": "ready"} and then one JSON line per
mDNS response that carries A records: {"event": "a", "t": CLOCK_MONOTONIC seconds (the
clock every namespace shares, so the test can compare it with its own), "from": the
sender's address, "records": [[name, address, ttl], ...]}, until ``--seconds`` have passed
or stdin is closed. It only listens: no query, no answer.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time

import dns.flags
import dns.message
import dns.rdatatype

MDNS_GROUP, MDNS_PORT = "224.0.0.251", 5353


def _address(rr: object) -> str:
    # With the cache-flush bit (class 0x8001) dnspython leaves the rdata generic.
    address = getattr(rr, "address", None)
    return str(address) if address is not None else socket.inet_ntoa(rr.data)  # type: ignore[attr-defined]


def main(args: argparse.Namespace) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", MDNS_PORT))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                 struct.pack("4s4s", socket.inet_aton(MDNS_GROUP),
                             socket.inet_aton(args.address)))
    print(json.dumps({"event": "ready"}), flush=True)
    end = time.monotonic() + args.seconds
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([s, sys.stdin], [], [], left)
        if sys.stdin in ready and not sys.stdin.readline():
            break  # the test closed our stdin: done
        if s not in ready:
            continue
        data, (sender, _) = s.recvfrom(9000)
        t = time.monotonic()
        m = dns.message.from_wire(data, continue_on_error=True)
        if not m.flags & dns.flags.QR:
            continue  # a query
        records = [[str(rrset.name), _address(rr), rrset.ttl]
                   for section in (m.answer, m.additional) for rrset in section
                   if rrset.rdtype == dns.rdatatype.A for rr in rrset]
        if records:
            print(json.dumps({"event": "a", "t": t, "from": sender, "records": records}),
                  flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True, help="this host's address (joins there)")
    p.add_argument("--seconds", type=float, default=60.0)
    main(p.parse_args())
