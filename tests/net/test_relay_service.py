"""The relay service (peerd.net.relay, issue 27 item 2): circuits carry a whole model entry,
the rendezvous point keeps fleets apart, and the limits py-libp2p lacks are ours.

Loopback only: the relay is a peerd transport with the service on its host; the clients
use py-libp2p's own Circuit Relay v2 and rendezvous client pieces (tests/net/relayhosts.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from libp2p.discovery.rendezvous.client import RendezvousClient
from libp2p.discovery.rendezvous.errors import RendezvousError
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

from peerd.net.relay import RELAY_LIMITS, RelayLimits, RelayService, fleet_namespace, serve_relay
from peerd.net.transport import Transport, open_transport
from tests.net.relayhosts import LOOPBACK, SINK, Client, no_handler, relay_clients

#: One weight entry of the largest model in docs/benchmarks.md is 44 MB: it must cross one
#: circuit whole, framing and the handshake included, under the default limits.
ENTRY_BYTES = 44_000_000
FLEET_A = bytes.fromhex("a1" * 16)
FLEET_B = bytes.fromhex("b2" * 16)


def _trio(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test under trio (the suite has no async plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(test, *args, **kwargs))

    return run


@asynccontextmanager
async def _relay(limits: RelayLimits = RELAY_LIMITS
                 ) -> AsyncIterator[tuple[Transport, RelayService, str]]:
    async with open_transport(os.urandom(32), no_handler, LOOPBACK) as t, \
            serve_relay(t.host, limits) as service:
        yield t, service, f"/ip4/127.0.0.1/tcp/{t.port}"


def _sink_into(client: Client, received: list[bytes], done: trio.Event, size: int) -> None:
    """``client`` keeps what one stream brings it (up to ``size`` bytes or a reset)."""

    async def sink(stream):  # type: ignore[no-untyped-def]
        buf = bytearray()
        try:
            while len(buf) < size:
                chunk = await stream.read(min(1 << 20, size - len(buf)))
                if not chunk:
                    break
                buf += chunk
            await stream.write(b"ok")
            await stream.close()
        except Exception:  # noqa: BLE001 - a reset circuit: what came is what counts
            pass
        finally:
            received.append(bytes(buf))
            done.set()

    client.transport.host.set_stream_handler(SINK, sink)


async def _send(sender: Client, target: Client, payload: bytes) -> None:
    stream = await sender.transport.host.new_stream(target.peer_id, [SINK])
    view = memoryview(payload)
    for i in range(0, len(payload), 1 << 20):
        await stream.write(bytes(view[i:i + (1 << 20)]))


@_trio
async def test_a_44_mb_entry_crosses_one_circuit_byte_identical() -> None:
    received: list[bytes] = []
    done = trio.Event()
    payload = os.urandom(ENTRY_BYTES)
    with trio.fail_after(60):
        async with _relay() as (relay, service, addr), relay_clients(2) as (a, b):
            rid = relay.host.get_id()
            _sink_into(a, received, done, ENTRY_BYTES)
            assert await a.reserve(rid, addr)
            await b.dial(rid, addr, a.peer_id)
            # B was never told an address of A: its only connection to A is the circuit.
            conns = b.transport.host.get_network().connections.get(a.peer_id, [])
            assert ["p2p-circuit" in str(c.get_transport_addresses()) for c in conns] == [True]
            assert service.stats().circuits == 1
            await _send(b, a, payload)
            await done.wait()
    assert len(received[0]) == ENTRY_BYTES
    assert received[0] == payload


@_trio
async def test_a_circuit_is_cut_at_its_byte_limit() -> None:
    limits = replace(RELAY_LIMITS, circuit_bytes=1 << 20)
    size = 4 << 20
    received: list[bytes] = []
    done = trio.Event()
    with trio.fail_after(30):
        async with _relay(limits) as (relay, _, addr), relay_clients(2) as (a, b):
            rid = relay.host.get_id()
            _sink_into(a, received, done, size)
            assert await a.reserve(rid, addr)
            await b.dial(rid, addr, a.peer_id)
            # The reset reaches the sender as whichever error the library raises for it.
            with contextlib.suppress(Exception):
                await _send(b, a, os.urandom(size))
            with trio.fail_after(10):
                await done.wait()
    assert len(received[0]) < limits.circuit_bytes


@pytest.mark.parametrize("limits", [
    replace(RELAY_LIMITS, reservations=2),
    replace(RELAY_LIMITS, reservations_per_ip=2),  # every client is on 127.0.0.1
], ids=["total", "per-ip"])
@_trio
async def test_reservations_beyond_the_cap_are_refused(limits: RelayLimits) -> None:
    with trio.fail_after(30):
        async with _relay(limits) as (relay, service, addr), relay_clients(3) as clients:
            rid = relay.host.get_id()
            granted = [await c.reserve(rid, addr) for c in clients]
            assert granted == [True, True, False]
            stats = service.stats()
            assert (stats.reservations, stats.refused_reservations) == (2, 1)
            # A refresh by a holder needs no new room.
            assert await clients[0].reserve(rid, addr)


@_trio
async def test_the_sweep_frees_the_slot_of_a_peer_that_left() -> None:
    with trio.fail_after(30):
        async with _relay() as (relay, service, addr):
            rid = relay.host.get_id()
            async with relay_clients(2) as (a, b):
                assert await a.reserve(rid, addr)
                await b.connect(rid, addr)
                service.sweep()
                assert service.stats().reservations == 1  # A is still connected
            with trio.fail_after(10):
                while relay.connected_peers():  # noqa: ASYNC110 - the swarm has no event
                    await trio.sleep(0.05)
            service.sweep()
            assert service.stats().reservations == 0


@_trio
async def test_a_peer_reserves_only_for_its_own_id() -> None:
    with trio.fail_after(30):
        async with _relay() as (relay, service, addr), relay_clients(2) as (a, other):
            rid = relay.host.get_id()
            await a.connect(rid, addr)
            stream = await a.transport.host.new_stream(rid, [HOP_ID])
            await write_delimited_msg(stream, HopMessage(
                type=HopMessage.RESERVE, peer=CircuitPeerId(id=other.peer_id.to_bytes())))
            answer = await read_delimited_msg(stream, HopMessage)
            assert StatusCode(answer.status) == StatusCode.PERMISSION_DENIED
            assert service.stats().reservations == 0
            assert service.stats().refused_reservations == 1


@_trio
async def test_circuits_beyond_the_total_are_refused() -> None:
    limits = replace(RELAY_LIMITS, circuits=1)
    with trio.fail_after(30):
        async with _relay(limits) as (relay, service, addr), relay_clients(3) as (a, b, c):
            rid = relay.host.get_id()
            assert await a.reserve(rid, addr)
            await b.dial(rid, addr, a.peer_id)
            with pytest.raises(ConnectionError):
                await c.dial(rid, addr, a.peer_id)
            stats = service.stats()
            assert (stats.circuits, stats.refused_circuits) == (1, 1)


@_trio
async def test_rendezvous_finds_members_of_the_same_fleet_only() -> None:
    with trio.fail_after(30):
        async with _relay() as (relay, service, addr), relay_clients(3) as (a, b, c):
            rid = relay.host.get_id()
            for client in (a, b, c):
                await client.connect(rid, addr)
            ns_a, ns_b = fleet_namespace(FLEET_A), fleet_namespace(FLEET_B)
            assert ns_a == "peerd/" + "a1" * 16
            # A longer TTL than ours is granted shorter.
            ttl = await RendezvousClient(a.transport.host, rid).register(ns_a, ttl=72 * 3600)
            assert ttl == RELAY_LIMITS.registration_ttl_s
            await RendezvousClient(c.transport.host, rid).register(ns_b)
            found, _ = await RendezvousClient(b.transport.host, rid).discover(ns_a)
            assert [p.peer_id for p in found] == [a.peer_id]
            assert found[0].addrs  # where A can be dialled
            found_b, _ = await RendezvousClient(b.transport.host, rid).discover(ns_b)
            assert [p.peer_id for p in found_b] == [c.peer_id]
            # Asking for a namespace nobody registered leaves no empty one behind.
            nobody, _ = await RendezvousClient(b.transport.host, rid).discover(
                fleet_namespace(b"\x07" * 16))
            assert nobody == []
            stats = service.stats()
            assert (stats.registrations, stats.namespaces) == (2, 2)


@_trio
async def test_rendezvous_limits_are_enforced() -> None:
    limits = replace(RELAY_LIMITS, registrations_per_peer=1)
    with trio.fail_after(30):
        async with _relay(limits) as (relay, service, addr), relay_clients(1) as (a,):
            rid = relay.host.get_id()
            await a.connect(rid, addr)
            rdv = RendezvousClient(a.transport.host, rid)
            with pytest.raises(RendezvousError):  # not a peerd namespace
                await rdv.register("elsewhere/x")
            await rdv.register(fleet_namespace(FLEET_A))
            await rdv.register(fleet_namespace(FLEET_A))  # a refresh: no new room
            with pytest.raises(RendezvousError):  # a second namespace for the same id
                await rdv.register(fleet_namespace(FLEET_B))
            stats = service.stats()
            assert (stats.registrations, stats.refused_registrations) == (1, 2)


def test_limits_fit_an_entry_and_refuse_nonsense() -> None:
    # Both directions share a circuit's budget: an entry plus its framing fits many times.
    assert RELAY_LIMITS.circuit_bytes > 4 * ENTRY_BYTES
    lib = RELAY_LIMITS.library_limits()
    assert (lib.data, lib.max_reservations) == (RELAY_LIMITS.circuit_bytes,
                                                RELAY_LIMITS.reservations)
    with pytest.raises(ValueError, match="circuits must be at least 1"):
        replace(RELAY_LIMITS, circuits=0)
    with pytest.raises(ValueError, match="a fleet id is needed"):
        fleet_namespace(b"")


# --- `peerd relay` -----------------------------------------------------------------------

PEERD_RELAY = [sys.executable, "-m", "peerd.cli", "relay"]


def _start_relay(state_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([*PEERD_RELAY, "--state-dir", str(state_dir), "--host", "127.0.0.1",
                             "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the start line, or "" if it died
    if not line:
        proc.wait(10)
        raise AssertionError(f"peerd relay did not start: {proc.stderr.read()!r}")  # type: ignore[union-attr]
    return proc, line.split()


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str]:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=15)
    return proc.returncode, err


def test_peerd_relay_carries_a_circuit_and_exits_0_on_a_signal(tmp_path: Path) -> None:
    proc, words = _start_relay(tmp_path / "relay")
    try:
        peer_id, addrs = words[0], words[1:]
        assert addrs == [a for a in addrs if a.endswith(f"/p2p/{peer_id}")]
        addr = addrs[0].removesuffix(f"/p2p/{peer_id}")
        size = 1 << 20
        payload = os.urandom(size)
        received: list[bytes] = []

        async def exchange() -> None:
            done = trio.Event()
            with trio.fail_after(30):
                async with relay_clients(2) as (a, b):
                    rid = ID.from_base58(peer_id)
                    _sink_into(a, received, done, size)
                    assert await a.reserve(rid, addr)
                    await b.dial(rid, addr, a.peer_id)
                    await _send(b, a, payload)
                    await done.wait()

        trio.run(exchange)
        assert received == [payload]
        assert (tmp_path / "relay" / "node.key").stat().st_mode & 0o777 == 0o600
    finally:
        code, err = _stop(proc, signal.SIGINT)
    assert code == 0
    assert "Traceback" not in err


def test_peerd_relay_keeps_its_peer_id_and_prints_json(tmp_path: Path) -> None:
    proc, words = _start_relay(tmp_path / "relay")
    assert _stop(proc)[0] == 0
    proc, json_words = _start_relay(tmp_path / "relay", "--json")
    assert _stop(proc)[0] == 0
    shown = json.loads(" ".join(json_words))
    assert shown["peer_id"] == words[0]  # the same key, read back from the state directory
    assert [a.split("/tcp/")[0] for a in shown["addrs"]] == ["/ip4/127.0.0.1"]


def _failure(args: list[str]) -> str:
    run = subprocess.run([*PEERD_RELAY, *args], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr  # one line, no traceback
    return lines[0]


def test_peerd_relay_start_up_failures_are_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _failure(["--state-dir", str(tmp_path / "a"), "--host", "127.0.0.1",
                         "--port", str(port)])
        assert "Address already in use" in line
    (tmp_path / "file").write_text("")
    line = _failure(["--state-dir", str(tmp_path / "file" / "state"), "--port", "0"])
    assert "cannot use state directory" in line  # a directory it cannot make (as root too)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "node.key").write_text("not a key")
    (bad / "node.key").chmod(0o600)
    assert "not a PEM private key" in _failure(["--state-dir", str(bad), "--port", "0"])
    (bad / "node.key").chmod(0o644)
    assert "must be 0600" in _failure(["--state-dir", str(bad), "--port", "0"])
