"""One libp2p stream as a :class:`~peerd.net.framing.FramedStream`: the :class:`Stream`
that :mod:`peerd.net.transport` hands its callers (re-exported there).

Owns what happens on a stream the transport has already opened or accepted: libp2p's many
error types turned into :class:`~peerd.net.framing.TransportError`, the peer's byte budgets
charged as bytes move, writes cut into bounded chunks, and half-close, close and reset under
deadlines. It must not open, accept or refuse streams or connections (that is
:mod:`peerd.net.transport`), nor know what travels in a frame (:mod:`peerd.net.framing`
reads and writes frames, :mod:`peerd.net.gossip` and :mod:`peerd.protocol` give them meaning).
"""

from __future__ import annotations

import logging

import trio
from libp2p.abc import INetStream
from libp2p.network.stream.exceptions import StreamEOF, StreamReset

from peerd.net.framing import FramedStream, StreamClosedError, TransportError
from peerd.net.transport_config import STREAM_CLOSE_TIMEOUT_S, PeerStats

# The transport's logger: docs/transport.md names it as where our transport logs go.
logger = logging.getLogger("peerd.net.transport")

#: Largest piece handed to libp2p per write call (Yamux splits it into window-sized frames).
WRITE_CHUNK_LEN = 1024 * 1024


class Stream(FramedStream):
    """One bidirectional stream to an authenticated peer.

    ``peer_id`` comes from the Noise handshake of the underlying connection, so it is the
    identity the remote proved, not one it claimed.
    """

    def __init__(self, raw: INetStream, peer_id: str, stats: PeerStats) -> None:
        self._raw = raw
        self.peer_id = peer_id
        self._stats = stats

    @property
    def remote_address(self) -> tuple[str, int] | None:
        return self._raw.get_remote_address()

    async def read_some(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` (at least 1); no deadline of its own, callers set one."""
        self._stats.check_budget(self._stats.budget_in, f"inbound byte budget for {self.peer_id}")
        try:
            data = await self._raw.read(max_bytes)
        except StreamEOF as e:
            raise StreamClosedError("stream closed by remote") from e
        except StreamReset as e:
            raise StreamClosedError("stream reset by remote") from e
        except Exception as e:  # libp2p raises a zoo of errors on a dead connection
            raise TransportError(f"read failed: {e!r}") from e
        if not data:
            raise StreamClosedError("stream closed by remote")
        self._stats.moved(len(data), inbound=True)
        return data

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data``; no deadline of its own, callers set one."""
        view = memoryview(data)
        # libp2p wants bytes: convert one slice at a time, so sending a 44 MB entry held as a
        # view costs one chunk of extra memory, not a second copy of the entry; the budget
        # is checked per chunk, so it is overdrawn by at most one.
        for lo in range(0, len(view), WRITE_CHUNK_LEN):
            self._stats.check_budget(self._stats.budget_out,
                                     f"outbound byte budget for {self.peer_id}")
            chunk = bytes(view[lo:lo + WRITE_CHUNK_LEN])
            try:
                await self._raw.write(chunk)
            except (StreamEOF, StreamReset) as e:
                raise StreamClosedError("stream closed by remote") from e
            except Exception as e:
                raise TransportError(f"write failed: {e!r}") from e
            self._stats.moved(len(chunk), inbound=False)

    async def close_write(self) -> None:
        """Half-close: the remote reads EOF after our last frame; we can still read."""
        with trio.move_on_after(STREAM_CLOSE_TIMEOUT_S):
            try:
                # NetStream has close_write, the INetStream interface does not declare it.
                await self._raw.close_write()  # type: ignore[attr-defined]
            except Exception as e:  # libp2p's muxer errors share no common base: wrap them all
                raise TransportError(f"close_write failed: {e!r}") from e

    async def linger(self, linger_s: float, max_bytes: int) -> bool:
        """End a refused peer's stream gracefully: half-close it (the peer reads EOF after
        our last frame), then read and drop what the peer still sends until it ends its side
        and hangs up the connection, within ``linger_s``. Meanwhile the connection stays
        open, so the peer's late bytes (its other streams: identify, window updates) draw no
        RST and its libp2p hands over every frame we wrote. False if it sent more than
        ``max_bytes`` on this stream meanwhile (the caller cuts it at once); never raises."""
        drained = 0
        with trio.move_on_after(linger_s):
            try:
                await self.close_write()
                while drained <= max_bytes:
                    drained += len(await self.read_some(max_bytes + 1 - drained))
                return False
            except TransportError:  # its end of stream (or a reset): it is done with it
                pass
            # Yamux's read loop keeps reading (and so draining) the connection until the
            # peer closes it; event_closed is Yamux's, not in the IMuxedConn interface.
            closed = getattr(self._raw.muxed_conn, "event_closed", None)
            if closed is not None:
                await closed.wait()
        return True

    async def close(self) -> None:
        """Graceful close; never raises (a dead peer is no error at this point)."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + STREAM_CLOSE_TIMEOUT_S):
            try:
                await self._raw.close()
            except Exception as e:  # noqa: BLE001 - teardown never raises (see docstring)
                logger.debug("close of stream to %s failed: %r", self.peer_id, e)

    async def reset(self) -> None:
        """Abort the stream (the remote sees a reset); never raises."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + STREAM_CLOSE_TIMEOUT_S):
            try:
                await self._raw.reset()
            except Exception as e:  # noqa: BLE001 - teardown never raises (see docstring)
                logger.debug("reset of stream to %s failed: %r", self.peer_id, e)
