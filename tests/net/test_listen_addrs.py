"""What a node bound to the wildcard says it listens on (issue 12, item 10): concrete
addresses, never ``/ip4/0.0.0.0``, in ``Transport.listen_addrs`` (``peerd status``) and in
what libp2p identify sends to peers, following the host's address changes (item 9).

The host listens on 0.0.0.0 inside a test namespace (never on the real LAN); unit tests of
:mod:`peerd.net.addrs` run anywhere."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from peerd.net import addrs
from peerd.net.addrs import Snapshot, concrete_addrs, host_ips
from tests.net.netns import IP_CMD_TIMEOUT_S, SUBNET, NetnsHost

#: A wildcard host in a namespace; one JSON line per line read on stdin: its listen_addrs and
#: the listen addresses of the identify message libp2p would send now (which drops /p2p/).
_WILDCARD_HOST = """
import json, sys, trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.identity.identify.identify import _mk_identify_protobuf
from multiaddr import Multiaddr
from peerd.net.transport import TransportConfig, open_transport

async def main():
    async def handler(stream):
        pass
    config = TransportConfig(listen_host="0.0.0.0")
    async with open_transport(Ed25519PrivateKey.generate(), handler, config) as t:
        while await trio.to_thread.run_sync(sys.stdin.readline):
            identify = _mk_identify_protobuf(t._host, None)
            print(json.dumps({"port": t.port, "listen": t.listen_addrs,
                              "identify": [str(Multiaddr(a)) for a in identify.listen_addrs]}),
                  flush=True)

trio.run(main)
"""


def _ask(p: subprocess.Popen[str]) -> dict[str, Any]:
    assert p.stdin is not None
    assert p.stdout is not None
    p.stdin.write("\n")
    p.stdin.flush()
    line = p.stdout.readline()
    assert line, p.stderr.read() if p.stderr else ""
    reply: dict[str, Any] = json.loads(line)
    return reply


def _ip(host: NetnsHost, *args: str) -> None:
    subprocess.run(["ip", "-n", host.name, *args], check=True, capture_output=True,
                   timeout=IP_CMD_TIMEOUT_S)


def test_a_wildcard_listener_reports_and_identifies_concrete_addresses_that_follow_the_host(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    (h,) = lan(1)
    p = subprocess.Popen(h.python("-c", _WILDCARD_HOST), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = _ask(p)
        port = first["port"]
        # Before: ["/ip4/0.0.0.0/tcp/P"] both here and in identify, which no peer can dial.
        assert first["listen"] == [f"/ip4/{h.address}/tcp/{port}"]
        assert first["identify"] == [f"/ip4/{h.address}/tcp/{port}"]

        new = f"{SUBNET}.101"
        _ip(h, "addr", "add", f"{new}/24", "dev", "eth0")
        both = _ask(p)
        assert both["listen"] == [f"/ip4/{h.address}/tcp/{port}",
                                  f"/ip4/{new}/tcp/{port}"]
        _ip(h, "addr", "flush", "dev", "eth0")
        alone = _ask(p)  # nothing but loopback left: that is still somewhere to be reached
        assert alone["listen"] == [f"/ip4/127.0.0.1/tcp/{port}"]
        assert alone["identify"] == [f"/ip4/127.0.0.1/tcp/{port}"]
    finally:
        if p.stdin is not None:
            p.stdin.close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    assert p.returncode == 0, p.stderr.read() if p.stderr else ""


def test_concrete_addrs_replaces_only_wildcards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(addrs, "host_ips",
                        lambda version=4: ("10.0.0.2", "10.0.1.7") if version == 4
                        else ("fd00::2",))
    assert concrete_addrs(["/ip4/0.0.0.0/tcp/4011", "/ip4/127.0.0.1/tcp/5",
                           "/ip6/::/tcp/4011", "/ip4/10.0.0.2/tcp/4011"]) == [
        "/ip4/10.0.0.2/tcp/4011", "/ip4/10.0.1.7/tcp/4011", "/ip4/127.0.0.1/tcp/5",
        "/ip6/fd00::2/tcp/4011"]


def test_host_ips_are_concrete_and_loopback_only_when_alone() -> None:
    ips = host_ips(4)
    assert ips  # every host has at least loopback
    assert "0.0.0.0" not in ips
    assert all(not ip.startswith("127.") for ip in ips) or ips == ("127.0.0.1",)
    assert all(not ip.startswith("fe80") for ip in host_ips(6))


def test_an_announcement_is_due_on_new_addresses_or_a_link_coming_up() -> None:
    base = Snapshot(("10.0.0.2",), frozenset({"lo", "eth0"}))
    assert not base.calls_for_announcement(base)
    assert Snapshot(("10.0.0.3",), base.links_up).calls_for_announcement(base)
    down = Snapshot(base.addresses, frozenset({"lo"}))
    assert not down.calls_for_announcement(base)  # a link going down: nothing to say
    assert base.calls_for_announcement(down)  # ... but coming back up is
