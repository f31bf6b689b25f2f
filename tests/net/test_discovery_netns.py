"""Discovery across real (namespaced) hosts: separate processes, a bridge, multicast."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from peerd.net.addrs import ADDRESS_POLL_S
from tests.net.mdns_procs import (
    SCENARIO_TIMEOUT_S,
    finish,
    processes,
    read_until,
    seed_and_id,
    start_node,
)
from tests.net.netns import IP_CMD_TIMEOUT_S, SUBNET, NetnsHost, replace_address


def test_two_nodes_find_each_other_and_ignore_another_fleet(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    h_a, h_b, h_c = lan(3)
    (seed_a, id_a), (seed_b, id_b), (seed_c, id_c) = (seed_and_id() for _ in range(3))
    with processes() as procs:
        # c (another fleet) first, on all interfaces; it stays until its stdin is closed.
        c = start_node(h_c, "--seed", seed_c, "--fleet", "fleet-other", "--until-eof")
        procs.append(c)
        # a stays until b is done (b dials a too); b leaves soon after both exchanges.
        a = start_node(h_a, "--seed", seed_a, "--fleet", "fleet-x", "--iface", "eth0",
                       "--expect", "1", "--dial", "--until-eof")
        procs.append(a)
        b = start_node(h_b, "--seed", seed_b, "--fleet", "fleet-x", "--iface", "eth0",
                       "--expect", "1", "--dial", "--linger", "0.5")
        procs.append(b)
        rb = finish(b)
        ra, rc = finish(a), finish(c)

    assert ra["found"] == [id_b]
    assert rb["found"] == [id_a]
    peer_b = next(e for e in ra["events"] if e["event"] == "peer")
    assert peer_b["addresses"] == [h_b.address]
    assert peer_b["fleet"] == "fleet-x"
    # The hint led to a connection whose Noise handshake proved the advertised id.
    for r, other in ((ra, id_b), (rb, id_a)):
        ex = [e for e in r["events"] if e["event"] == "exchanged"]
        assert ex == [{"event": "exchanged", "peer": other, "proven": other, "ok": True,
                       "t": ex[0]["t"]}]
    # c was on the wire (and ignored), by a and b alike; c heard both and took neither.
    assert ra["rejected"].get("other_fleet", 0) >= 1
    assert rb["rejected"].get("other_fleet", 0) >= 1
    assert rc["found"] == []
    assert rc["rejected"].get("other_fleet", 0) >= 2
    # Everyone saw its own advertisement come back and dropped it.
    assert all(r["rejected"].get("own_record", 0) >= 1 for r in (ra, rb, rc))
    assert id_c not in ra["found"] + rb["found"]


def _ip_netns(host: NetnsHost, *args: str) -> None:
    subprocess.run(["ip", "-n", host.name, *args], check=True, capture_output=True,
                   timeout=IP_CMD_TIMEOUT_S)


def _mdns_a_records(via: NetnsHost, name: str, server: str) -> list[str]:
    """An independent resolver (dnspython, not zeroconf): ask ``server``:5353 for ``name``'s
    A records by unicast, as `dig -p 5353 @server name` does."""
    # zeroconf's NSEC in the additional section compresses a name where dnspython forbids it:
    # that section's error is tolerated (continue_on_error), the answer is parsed strictly.
    code = (
        "import socket, sys, dns.message, dns.rdatatype\n"
        "q = dns.message.make_query(sys.argv[1], 'A')\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.settimeout(3)\n"
        "s.sendto(q.to_wire(), (sys.argv[2], 5353))\n"
        "r = dns.message.from_wire(s.recv(9000), continue_on_error=True)\n"
        "assert r.id == q.id and r.question == q.question, r\n"
        "print(' '.join(sorted(rr.address for s in r.answer if s.rdtype == dns.rdatatype.A"
        " for rr in s)))\n"
    )
    out = subprocess.run(via.python("-c", code, name, server), capture_output=True, text=True,
                         timeout=SCENARIO_TIMEOUT_S, check=True)
    return out.stdout.split()


def test_a_node_whose_address_changes_is_found_and_reached_at_the_new_one(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    # Issue 12, item 9: the advertised address used to be frozen at start-up, so peers kept
    # dialling the deleted one until the node restarted. As reproduced there: a secondary
    # address is added and promoted when the primary is deleted (without promote_secondaries
    # Linux deletes the secondaries of a subnet along with its primary).
    h_a, h_b = lan(2)
    new = f"{SUBNET}.101"
    (seed_a, id_a), (seed_b, _) = seed_and_id(), seed_and_id()
    events: list[dict[str, Any]] = []
    with processes() as procs:
        a = start_node(h_a, "--seed", seed_a, "--fleet", "fleet-x", "--until-eof",
                       "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(a)
        b = start_node(h_b, "--seed", seed_b, "--fleet", "fleet-x", "--expect", "1", "--dial",
                       "--expect-address", new, "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(b)
        first = read_until(b, events, lambda e: e["event"] == "exchanged")
        assert first["peer"] == id_a
        assert first["ok"]
        assert next(e for e in events if e["event"] == "peer")["addresses"] == [h_a.address]

        replace_address(h_a, new)
        changed = time.monotonic()
        moved = read_until(b, events, lambda e: e["event"] == "peer" and new in e["addresses"])
        found_after = time.monotonic() - changed
        reached = read_until(b, events, lambda e: e.get("via") == new)
        # Within one look at the interfaces and an announcement (plus a loaded machine).
        assert found_after < ADDRESS_POLL_S + 10, found_after
        assert moved["id"] == id_a
        assert reached["proven"] == id_a, reached
        assert reached["ok"]
        # Asked directly, the node answers with the new address only.
        assert _mdns_a_records(h_b, f"{id_a}.local.", new) == [new]
        finish(b)
        finish(a)


#: Listens for mDNS responses (announcements) naming argv[1] on 224.0.0.251, from the address
#: argv[2], for argv[3] seconds: prints "ready", then one "announce" line per announcement.
_ANNOUNCEMENT_LISTENER = """
import socket, struct, sys, time, dns.flags, dns.message
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", 5353))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
             struct.pack("4s4s", socket.inet_aton("224.0.0.251"), socket.inet_aton(sys.argv[2])))
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[3])
while (left := end - time.monotonic()) > 0:
    s.settimeout(left)
    try:
        data = s.recv(9000)
    except TimeoutError:
        break
    m = dns.message.from_wire(data, continue_on_error=True)
    if m.flags & dns.flags.QR and any(sys.argv[1] in str(rrset.name) for rrset in m.answer):
        print("announce", flush=True)
"""


def test_a_node_announces_itself_again_when_its_link_comes_back_up(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    # Issue 12, item 9: nothing was re-announced after a link down/up, so peers that forgot
    # the node meanwhile (or joined the link then) heard of it again only by querying.
    # An independent listener (no zeroconf) on the other host hears the announcement.
    h_a, h_b = lan(2)
    seed_a, id_a = seed_and_id()
    with processes() as procs:
        a = start_node(h_a, "--seed", seed_a, "--fleet", "fleet-x", "--until-eof",
                       "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(a)
        read_until(a, [], lambda e: e["event"] == "ready")
        _ip_netns(h_a, "link", "set", "eth0", "down")
        # The fault itself: down for longer than one look at the links, so A sees it.
        time.sleep(1.5 * ADDRESS_POLL_S)
        listener = subprocess.Popen(
            h_b.python("-c", _ANNOUNCEMENT_LISTENER, id_a, h_b.address,
                       str(3 * ADDRESS_POLL_S)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(listener)
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "ready"
        _ip_netns(h_a, "link", "set", "eth0", "up")
        up = time.monotonic()
        heard = listener.stdout.readline().strip()  # the listener's own deadline bounds this
        after = time.monotonic() - up
        assert heard == "announce", listener.stderr.read() if listener.stderr else ""
        assert after < ADDRESS_POLL_S + 5, after
        finish(a)
