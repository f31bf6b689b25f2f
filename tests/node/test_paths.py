"""A peer's path from its connections' remote multiaddrs (peerd.node.paths; issue 27 item 3)."""

from __future__ import annotations

import ipaddress

import pytest

from peerd.node.paths import PeerPath, classify, ip_of, relay_of

RELAY = "12D3KooWQoZCTWQKSDb8R8dJ1ybPTB6BniCktUTQRyNPvEweoHW9"
PEER = "12D3KooWNdD52pNh91zJwXAuLRMsaAwotPwR3zv5UUKeyPfxSZRF"
NETS = [ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("2001:db8:1::/64")]


@pytest.mark.parametrize(("addr", "kind"), [
    ("/ip4/192.168.1.17/tcp/4001", "lan"),          # in our /24
    ("/ip4/10.200.3.4/tcp/4001", "lan"),            # in our /8
    ("/ip4/192.168.2.17/tcp/4001", "direct"),       # the next /24 over: routed
    ("/ip4/203.0.113.9/tcp/4001", "direct"),
    ("/ip4/169.254.7.7/tcp/4001", "lan"),           # IPv4 link-local
    ("/ip4/127.0.0.1/tcp/4001", "lan"),             # this host
    ("/ip6/::1/tcp/4001", "lan"),
    ("/ip6/fe80::1ff:fe23:4567:890a/tcp/4001", "lan"),  # IPv6 link-local
    ("/ip6/fe80::1%eth0/tcp/4001", "lan"),          # with a zone
    ("/ip6/2001:db8:1::5/tcp/4001", "lan"),          # in our /64
    ("/ip6/2001:db8:2::5/tcp/4001", "direct"),
    ("/ip6/::ffff:192.168.1.9/tcp/4001", "lan"),     # IPv4-mapped: read as IPv4
    ("/ip6/::ffff:198.51.100.9/tcp/4001", "direct"),
])
def test_direct_connections_lan_or_direct(addr: str, kind: str) -> None:
    assert classify([addr], NETS) == PeerPath(kind)  # type: ignore[arg-type]


def test_mdns_vouches_for_locality() -> None:
    # mDNS reaches only our own links: a peer it found is on the LAN even when numbered
    # outside our prefix.
    assert classify(["/ip4/203.0.113.9/tcp/4001"], NETS, mdns=True) == PeerPath("lan")


def test_relayed_names_the_relay() -> None:
    circuit = f"/ip4/198.51.100.1/tcp/4011/p2p/{RELAY}/p2p-circuit/p2p/{PEER}"
    assert classify([circuit], NETS) == PeerPath("relayed", RELAY)
    # As py-libp2p labels the connections it carries: no transport part.
    assert classify([f"/p2p/{RELAY}/p2p-circuit/p2p/{PEER}"], NETS) == PeerPath("relayed", RELAY)
    # A relay over a LAN address is still a relay, whatever mDNS says.
    lan_relay = f"/ip4/192.168.1.2/tcp/4011/p2p/{RELAY}/p2p-circuit/p2p/{PEER}"
    assert classify([lan_relay], NETS, mdns=True) == PeerPath("relayed", RELAY)
    assert classify([f"/p2p-circuit/p2p/{PEER}"], NETS) == PeerPath("relayed", None)


def test_a_direct_connection_beats_a_relayed_one() -> None:
    circuit = f"/p2p/{RELAY}/p2p-circuit/p2p/{PEER}"
    assert classify([circuit, "/ip4/203.0.113.9/tcp/4001"], NETS) == PeerPath("direct")
    assert classify(["/ip4/192.168.1.3/tcp/1", circuit], NETS) == PeerPath("lan")


def test_hole_punched_only_when_told_and_direct() -> None:
    circuit = f"/p2p/{RELAY}/p2p-circuit/p2p/{PEER}"
    assert classify(["/ip4/203.0.113.9/tcp/4001"], NETS, hole_punched=True) == \
        PeerPath("hole-punched")
    # Still relayed: the punch has not replaced the connection (yet).
    assert classify([circuit], NETS, hole_punched=True) == PeerPath("relayed", RELAY)


def test_no_connection_no_path() -> None:
    assert classify([], NETS) is None


def test_parsers() -> None:
    assert relay_of(f"/p2p/{RELAY}/p2p-circuit/p2p/{PEER}") == RELAY
    assert relay_of("/ip4/1.2.3.4/tcp/1") is None
    assert ip_of("/dns4/example.org/tcp/1") is None
    assert ip_of("/ip4/not-an-ip/tcp/1") is None
    # An address that is neither IP nor circuit is a direct path we cannot place.
    assert classify(["/dns4/example.org/tcp/1"], NETS) == PeerPath("direct")
