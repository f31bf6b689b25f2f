"""Mend 9's judgement of a connection (peerd.net.liveness, peerd.net.mends) on stand-in
sockets: what counts as stalled or orphaned, and that a connection is found under libp2p's
layers. The real thing, in namespaces: tests/net/test_stale_connections.py."""

from __future__ import annotations

import socket
import struct
from collections.abc import Hashable
from typing import Any

import trio

from peerd.net.liveness import Liveness
from peerd.net.mends import local_ip, socket_of, stalled, tune_socket
from peerd.net.transport_config import (
    STALLED_PROBES,
    STALLED_RETRANSMITS,
    TCP_KEEPALIVE_IDLE_S,
    TCP_USER_TIMEOUT_S,
)


class FakeSocket:
    """A TCP socket as mend 9 reads it: TCP_INFO's head, the local address, shutdown."""

    def __init__(self, ip: str = "10.0.0.1", retransmits: int = 0, *, probes: int = 0,
                 broken: bool = False) -> None:
        self.ip, self.retransmits, self.probes, self.broken = ip, retransmits, probes, broken
        self.options: dict[tuple[int, int], int] = {}
        self.shut: int | None = None

    def setsockopt(self, level: int, option: int, value: int, /) -> None:
        self.options[(level, option)] = value

    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes:
        if self.broken:
            raise OSError(9, "Bad file descriptor")
        # state ESTABLISHED, ca_state, retransmits, probes, backoff, then zeros
        return struct.pack("5B", 1, 0, self.retransmits, self.probes,
                           self.retransmits) + bytes(99)

    def getsockname(self) -> Any:
        if self.broken:
            raise OSError(9, "Bad file descriptor")
        return (self.ip, 4011)

    def shutdown(self, how: int, /) -> None:
        self.shut = how


class Layer:
    """One layer of a libp2p connection: only its attributes matter (hashable, by id)."""

    def __init__(self, **attrs: object) -> None:
        self.__dict__.update(attrs)


def layered(sock: FakeSocket) -> Layer:
    """py-libp2p's layers over a TCP socket: Yamux, secure session, Noise, raw, trio."""
    raw = Layer(stream=Layer(stream=Layer(socket=sock)))
    return Layer(secured_conn=Layer(conn=Layer(conn=raw)))


def test_the_socket_is_found_under_libp2ps_layers() -> None:
    sock = FakeSocket()
    assert socket_of(layered(sock)) is sock
    assert socket_of(Layer(secured_conn=Layer(conn=None))) is None
    assert socket_of(object()) is None


def test_stalled_means_retransmission_timeouts_in_a_row() -> None:
    assert not stalled(FakeSocket(retransmits=STALLED_RETRANSMITS - 1))
    assert stalled(FakeSocket(retransmits=STALLED_RETRANSMITS))
    assert not stalled(FakeSocket(broken=True))  # unreadable: no verdict


def test_stalled_means_keepalive_probes_unanswered_in_a_row() -> None:
    # An idle connection's path gone silent: no data is in flight, so no retransmission
    # ever counts; the kernel's unanswered keepalive probes do.
    assert not stalled(FakeSocket(probes=STALLED_PROBES - 1))
    assert stalled(FakeSocket(probes=STALLED_PROBES))


def test_local_ip_reads_ipv4_mapped_addresses_as_ipv4() -> None:
    assert local_ip(FakeSocket("::ffff:10.0.0.7")) == "10.0.0.7"
    assert local_ip(FakeSocket("fe80::1%eth0")) == "fe80::1"
    assert local_ip(FakeSocket(broken=True)) is None


def test_tune_socket_sets_keepalive_and_the_user_timeout() -> None:
    sock = FakeSocket()
    tune_socket(sock)
    assert sock.options[(socket.SOL_SOCKET, socket.SO_KEEPALIVE)] == 1
    assert sock.options[(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)] == int(
        TCP_USER_TIMEOUT_S * 1000)
    assert sock.options[(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)] == int(TCP_KEEPALIVE_IDLE_S)


def test_a_dead_connection_is_judged_and_closed_a_live_one_kept() -> None:
    live, stuck, moved = FakeSocket(), FakeSocket(retransmits=9), FakeSocket("10.0.0.9")
    conns: dict[str, Hashable] = {"live": layered(live), "stuck": layered(stuck),
                                  "moved": layered(moved),
                                  "odd": layered(FakeSocket(broken=True))}
    closed: list[Hashable] = []

    async def close(conn: Hashable) -> None:
        closed.append(conn)

    liveness = Liveness(lambda peer: [(p, c) for p, c in conns.items()
                                      if peer in (None, p)], close)
    ours = frozenset({"10.0.0.1"})
    assert liveness.dead(conns["live"], ours) is None
    assert liveness.dead(conns["stuck"], ours) == "stalled"
    assert liveness.dead(conns["moved"], ours) == "address gone"
    assert liveness.dead(conns["moved"], None) is None  # addresses not checked
    assert liveness.dead(conns["moved"], frozenset()) is None  # an empty read proves nothing
    assert liveness.dead(conns["odd"], ours) is None

    async def body() -> None:
        assert await liveness.drop_dead("live", ours) == 0
        assert await liveness.drop_dead(None, ours) == 2

    trio.run(body)
    assert closed == [conns["stuck"], conns["moved"]]
    assert stuck.shut == moved.shut == socket.SHUT_RDWR
    assert live.shut is None
    assert liveness.closed == {"stalled": 1, "address gone": 1}
