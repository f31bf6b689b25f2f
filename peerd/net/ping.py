"""Round-trip times of connected peers, measured with libp2p's ping protocol.

``/ipfs/ping/1.0.0`` (the libp2p spec: 32 random bytes written, the same 32 read back) is
served by every py-libp2p host by default (``libp2p.host.defaults``: a ``PingService``,
behind mend 15's fence), so every member answers; no peerd protocol is needed. The client is
ours: py-libp2p's ``PingService`` reports whole milliseconds (``int``), which reads 0 for
every peer on a LAN or on one host, and keeps its outbound stream open for the next ping.
Here one stream per sample is opened, timed with ``time.perf_counter`` and closed.

A ping is not meant to dial: only a peer with an open connection is pinged (a dial is
gossip's business, with its own backoff), checked just before the stream is opened, so the
RTT is that connection's. ``host.new_stream`` dials a peer it has no connection to, so a
connection that closes between that check and the stream's opening could be redialled once
by the library; the window holds no await of ours. The schedule and its
bounds (every peer at most once per :data:`~peerd.node.rtt.PING_INTERVAL_S`, at most
:data:`~peerd.node.rtt.MAX_PINGS_IN_FLIGHT` at once) are :class:`~peerd.node.rtt.RttTable`'s.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable

import trio
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol

from peerd.net.swarmconns import parse_peer_id
from peerd.net.transport import Transport
from peerd.node.rtt import PING_TIMEOUT_S, RttTable

logger = logging.getLogger(__name__)

PING_PROTOCOL = TProtocol("/ipfs/ping/1.0.0")
PING_LENGTH = 32
#: Seconds between two looks for due peers (a look only compares timestamps).
PING_TICK_S = 1.0


class PingError(Exception):
    """A ping that got no matching answer in time."""


async def ping_ms(host: IHost, peer_id: str, timeout_s: float = PING_TIMEOUT_S) -> float:
    """One round trip to a connected peer over a fresh ping stream, in milliseconds."""
    payload = secrets.token_bytes(PING_LENGTH)
    try:
        with trio.fail_after(timeout_s):
            stream = await host.new_stream(parse_peer_id(peer_id), [PING_PROTOCOL])
            try:
                start = time.perf_counter()
                await stream.write(payload)
                got = b""
                while len(got) < PING_LENGTH:
                    chunk = await stream.read(PING_LENGTH - len(got))
                    if not chunk:
                        break
                    got += chunk
                elapsed = time.perf_counter() - start
            except BaseException:
                await _quietly(stream.reset)
                raise
            await _quietly(stream.close)
    except trio.TooSlowError as e:
        raise PingError(f"no pong from {peer_id} within {timeout_s:.0f} s") from e
    except PingError:
        raise
    except Exception as e:  # py-libp2p's stream errors have no common base
        raise PingError(f"ping to {peer_id} failed: {e!r}") from e
    if got != payload:
        raise PingError(f"ping to {peer_id}: wrong pong ({len(got)} bytes)")
    return elapsed * 1000.0


async def _quietly(action: Callable[[], object]) -> None:
    try:
        result = action()
        if hasattr(result, "__await__"):
            await result
    except Exception as e:  # noqa: BLE001 - the stream is done with either way
        logger.debug("ending a ping stream failed: %r", e)


class Pinger:
    """Pings the peers ``targets()`` names that are connected, on the table's schedule."""

    def __init__(self, transport: Transport, targets: Callable[[], Iterable[str]],
                 table: RttTable | None = None) -> None:
        self._transport = transport
        self._targets = targets
        self.table = table if table is not None else RttTable()

    def connected_targets(self) -> list[str]:
        return [p for p in self._targets() if self._transport.is_connected(p)]

    async def run(self, tick_s: float = PING_TICK_S) -> None:
        async with trio.open_nursery() as pings:
            while True:
                connected = self.connected_targets()
                self.table.keep_only(connected)
                for peer in self.table.due(connected, trio.current_time()):
                    pings.start_soon(self._one, peer)
                await trio.sleep(tick_s)

    async def _one(self, peer: str) -> None:
        if not self._transport.is_connected(peer):  # gone since the tick: never dial
            self.table.failed(peer)
            return
        try:
            rtt = await ping_ms(self._transport.host, peer)
        except PingError as e:
            logger.debug("%s", e)
            self.table.failed(peer)
        else:
            self.table.record(peer, rtt)
