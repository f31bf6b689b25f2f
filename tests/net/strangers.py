"""Throw-away libp2p identities that dial a host and hold their connections open (tests).

Each stranger is a fresh Ed25519 key that completes TCP + Noise + Yamux with the target,
exactly what py-libp2p's swarm would do, without a host of its own (300 hosts would cost
300 swarms). What a stranger then does is nothing: it holds the connection, the way an
outsider trying to fill a node's inbound slots would, until the target closes it or the
block exits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import IMuxedConn
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.transport.tcp.tcp import TCP
from libp2p.transport.upgrader import TransportUpgrader

#: One stranger's TCP connect + Noise + Yamux negotiation on loopback.
HANDSHAKE_TIMEOUT_S = 30.0


@dataclass
class Stranger:
    peer_id: str
    conn: IMuxedConn | None = None  # None: the handshake did not complete
    error: str | None = None

    @property
    def closed_by_target(self) -> bool:
        return self.conn is not None and bool(self.conn.is_closed)

    async def wait_closed(self) -> None:
        """Until the target closed the connection (Yamux sets ``event_closed`` on the GoAway
        or the EOF that its read loop sees)."""
        assert self.conn is not None
        closed: trio.Event = self.conn.event_closed  # type: ignore[attr-defined]
        await closed.wait()


async def _dial(stranger_seed: bytes, target: ID, addr: multiaddr.Multiaddr,
                nursery: trio.Nursery) -> Stranger:
    key_pair = create_new_key_pair(stranger_seed)
    me = Stranger(str(ID.from_pubkey(key_pair.public_key)))
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    upgrader = TransportUpgrader({NOISE_PROTOCOL_ID: noise},
                                 {TProtocol(YAMUX_PROTOCOL_ID): Yamux})
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            raw = await TCP().dial(addr)
            secured = await upgrader.upgrade_security(raw, True, target)
            conn = await upgrader.upgrade_connection(secured, target)
    except Exception as e:  # noqa: BLE001 - a refused stranger is a result, not a failure
        me.error = repr(e)
        return me
    me.conn = conn
    nursery.start_soon(conn.start)  # reads the target's frames: a close is noticed
    return me


@asynccontextmanager
async def strangers(target_id: str, target_addr: str, count: int,
                    *, concurrency: int = 32) -> AsyncIterator[list[Stranger]]:
    """``count`` strangers connected to ``target_id`` at ``target_addr`` (dialled
    ``concurrency`` at a time), held until the block exits."""
    target, addr = ID.from_base58(target_id), multiaddr.Multiaddr(target_addr)
    out: list[Stranger] = []
    limiter = trio.CapacityLimiter(concurrency)
    async with trio.open_nursery() as holders:

        async def one() -> None:
            async with limiter:
                out.append(await _dial(os.urandom(32), target, addr, holders))

        async with trio.open_nursery() as dials:
            for _ in range(count):
                dials.start_soon(one)
        try:
            yield out
        finally:
            with trio.CancelScope(shield=True):
                for s in out:
                    if s.conn is not None and not s.conn.is_closed:
                        with trio.move_on_after(1):
                            await s.conn.close()
            holders.cancel_scope.cancel()


@contextmanager
def strangers_in_thread(target_id: str, target_addr: str, count: int,
                        *, timeout_s: float = 120.0) -> Iterator[list[Stranger]]:
    """:func:`strangers` for a synchronous test: held by a trio loop in a thread of its own
    from the moment all ``count`` have dialled until the block exits."""
    ready = threading.Event()
    held: list[Stranger] = []
    failure: list[BaseException] = []
    token: list[trio.lowlevel.TrioToken] = []
    release = trio.Event()

    async def hold() -> None:
        token.append(trio.lowlevel.current_trio_token())
        async with strangers(target_id, target_addr, count) as out:
            held.extend(out)
            ready.set()
            await release.wait()

    def main() -> None:
        try:
            trio.run(hold)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread below
            failure.append(e)
        finally:
            ready.set()

    thread = threading.Thread(target=main, name="strangers", daemon=True)
    thread.start()
    try:
        if not ready.wait(timeout_s) or failure:
            raise AssertionError(f"strangers did not connect: {failure}")
        yield held
    finally:
        if token:
            with suppress(trio.RunFinishedError):  # it ended already (a failed dial)
                trio.from_thread.run_sync(release.set, trio_token=token[0])
        thread.join(timeout_s)
