"""Connections that outlived their path are not reused (mend 9, issue 12's soak): two
transports in their own namespaces (tests/net/conn_proc.py), a partition that heals and
an address deleted under an open connection.

Before mend 9, py-libp2p reused the connection that carried data during a partition, so
the first stream after the heal waited for TCP's next retransmission (or timed out), and
kept a connection bound to a deleted address open (idle, nothing ever noticed). Each test
asserts where the next stream goes: over a fresh connection, from an address the host has.
"""

from __future__ import annotations

import json
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from peerd.mesh.netns import unavailable
from peerd.net.transport_config import STALLED_RETRANSMITS, TCP_USER_TIMEOUT_S
from tests.integration.topology import Topology, topology
from tests.net.netns import NetnsHost

pytestmark = pytest.mark.integration

PORT = 4170
#: Upper bound on waiting for the kernel to show a state (retransmissions, a close): a
#: deadline for a condition polled, not a measured speed.
KERNEL_STATE_DEADLINE_S = 40.0


class Proc:
    def __init__(self, host: NetnsHost, seed: int) -> None:
        self.proc = subprocess.Popen(
            host.python("-m", "tests.net.conn_proc", "--port", str(PORT), "--seed",
                        str(seed)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        hello = self.read(60)
        self.id: str = hello["id"]
        self.addrs = [f"/ip4/{host.address}/tcp/{PORT}"]

    def read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"conn_proc silent or gone (rc {self.proc.poll()})"
        result: dict[str, Any] = json.loads(line)
        return result

    def ask(self, cmd: dict[str, Any], wait_s: float = 60) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read(wait_s)

    def echo(self, other: Proc, timeout: float) -> dict[str, Any]:
        return self.ask({"cmd": "echo", "peer": other.id, "addrs": other.addrs,
                         "timeout": timeout}, wait_s=timeout + 30)

    def conns(self, other: Proc) -> list[dict[str, Any]]:
        conns: list[dict[str, Any]] = self.ask({"cmd": "conns", "peer": other.id})["conns"]
        return conns

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@contextmanager
def pair() -> Iterator[tuple[Topology, NetnsHost, NetnsHost, Proc, Proc]]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with topology() as net:
        net.bridge("lan")
        net.bridge("island")
        ha = net.host("a", ("lan", "10.76.0.1/24"))
        hb = net.host("b", ("lan", "10.76.0.2/24"))
        a = Proc(ha, 1)
        try:
            b = Proc(hb, 2)
            try:
                yield net, ha, hb, a, b
            finally:
                b.close()
        finally:
            a.close()


def wait_for(what: str, cond: Any) -> Any:
    deadline = time.monotonic() + KERNEL_STATE_DEADLINE_S
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.5)  # polling kernel state: no event tells us
    raise AssertionError(f"not within {KERNEL_STATE_DEADLINE_S:g} s: {what}")


def test_a_connection_that_stalled_in_a_partition_is_not_reused_after_the_heal() -> None:
    with pair() as (net, _, hb, a, b):
        first = a.echo(b, timeout=10)
        assert first["ok"], first
        # Every libp2p socket carries the bound on unacknowledged data, both sides.
        assert [c["user_timeout_ms"] for c in a.conns(b)] == [TCP_USER_TIMEOUT_S * 1000]
        assert [c["user_timeout_ms"] for c in b.conns(a)] == [TCP_USER_TIMEOUT_S * 1000]
        net.move(hb, "eth0", "island")  # the cable into another switch: no link change
        cut = a.echo(b, timeout=2)  # its stream open is left unacknowledged on the wire
        assert not cut["ok"]
        # TCP retransmits it, with a doubling timeout, until the connection is gone or
        # counts as stalled (STALLED_RETRANSMITS timeouts in a row).
        wait_for(f"{STALLED_RETRANSMITS} retransmissions or a close",
                 lambda: all(c["stalled"] for c in a.conns(b) if c["local"] == first["local"]))
        net.move(hb, "eth0", "lan")
        healed = a.echo(b, timeout=10)
        print(f"first stream after the heal: {healed}")  # its wall_s: for the record only
        assert healed["ok"], healed
        assert healed["local"] != first["local"], "the stalled connection was reused"
        assert first["local"] not in [c["local"] for c in a.conns(b)]


def test_a_connection_bound_to_a_deleted_address_is_closed() -> None:
    with pair() as (_, ha, _, a, b):
        first = a.echo(b, timeout=10)
        assert first["ok"], first
        assert first["local"].startswith("10.76.0.1:")
        # A DHCP renewal with a new address: the new one added, the old one deleted.
        for argv in (["sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/eth0/promote_secondaries"],
                     ["ip", "addr", "add", "10.76.0.101/24", "dev", "eth0"],
                     ["ip", "addr", "del", "10.76.0.1/24", "dev", "eth0"]):
            subprocess.run(ha.command(argv), check=True, timeout=10)
        # Idle, the connection would never notice; the transport's sweep closes it.
        wait_for("the connection on the deleted address closed",
                 lambda: not any(c["local"].startswith("10.76.0.1:") for c in a.conns(b)))
        moved = a.echo(b, timeout=10)
        assert moved["ok"], moved
        assert moved["local"].startswith("10.76.0.101:"), moved
