"""A stranger that opens one peerd session and reads the refusal late (tests of issue 27 item 6).

Each session is a fresh Ed25519 key over TCP + Noise + Yamux (the pieces of
tests/net/strangers.py) that negotiates ``/peerd/cache/1.0.0``, sends its Hello and, right
after it, more bytes (a second frame, as a client that pipelines would), then waits before it
reads anything: the client of a busy host, or js-libp2p with identify on, whose own streams
(identify's request and answer) go on while the refusal is in flight. After the wait it sends
its late bytes (a Yamux ping), reads what the member said and hangs up.

A client library drops what it had not yet handed to its reader when the connection is torn
down under it: js-libp2p on the RST that its late bytes draw from a closed socket,
py-libp2p's Yamux on any close (its read loop clears every stream's buffer). So whether this
stranger reads Hello + ``error`` tells whether the member let it finish before closing.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.protocol_muxer.multiselect_client import MultiselectClient
from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.transport.tcp.tcp import TCP
from libp2p.transport.upgrader import TransportUpgrader

from peerd.net.framing import TransportError, read_frame, write_frame
from peerd.net.stream import Stream
from peerd.net.transport_config import PROTOCOL_ID, PeerStats
from peerd.protocol import messages as msg

#: Dial, handshake and the whole session of one stranger.
SESSION_TIMEOUT_S = 10.0
#: Yamux PING with SYN: the late bytes (12, a header only; any frame would do).
_PING = struct.pack(">BBHII", 0, 2, 1, 0, 7)


@dataclass(frozen=True)
class Outcome:
    """What one stranger read: the types of the frames (``error:CODE`` for an error) and,
    if reading stopped on a failure rather than the member's end of stream, that failure."""

    frames: tuple[str, ...]
    failure: str | None
    #: Seconds from our Hello to the member closing the connection; None if we hung up first.
    closed_by_member_s: float | None = None

    @property
    def refused_politely(self) -> bool:
        return self.frames == ("hello", "error:not_member")


async def refused_session(target_id: str, target_addr: str, fleet_id: bytes, *,
                          wait_s: float, pipelined: int = 0) -> Outcome:
    """One stranger session against ``target_id``: Hello + one more frame (of ``pipelined``
    bytes if given, else an empty Want), ``wait_s`` without reading, the late bytes, then
    every frame up to the member's end of stream."""
    key_pair = create_new_key_pair(os.urandom(32))
    me = str(ID.from_pubkey(key_pair.public_key))
    target = ID.from_base58(target_id)
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    upgrader = TransportUpgrader({NOISE_PROTOCOL_ID: noise},
                                 {TProtocol(YAMUX_PROTOCOL_ID): Yamux})
    frames: list[str] = []
    failure: str | None = None
    closed: list[float] = []
    hung_up = False
    with trio.fail_after(SESSION_TIMEOUT_S):
        raw = await TCP().dial(multiaddr.Multiaddr(target_addr))
        secured = await upgrader.upgrade_security(raw, True, target)
        conn = await upgrader.upgrade_connection(secured, target)
        assert isinstance(conn, Yamux)  # the only muxer offered
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.start)
            sent_hello = trio.current_time()

            async def watch() -> None:
                await conn.event_closed.wait()  # set by its read loop on a GoAway or EOF
                if not hung_up:
                    closed.append(trio.current_time() - sent_hello)

            nursery.start_soon(watch)
            try:
                muxed = await conn.open_stream()
                await MultiselectClient().select_one_of(
                    [TProtocol(PROTOCOL_ID)], MultiselectCommunicator(muxed))
                stream = Stream(muxed, target_id, PeerStats())  # type: ignore[arg-type]
                sent_hello = trio.current_time()
                await write_frame(stream, msg.Hello(fleet_id, me, 0).head())
                await write_frame(stream, os.urandom(pipelined) if pipelined  # never read
                                  else msg.Want(()).head())
                await trio.sleep(wait_s)  # reading slowly: the member's frames wait for us
                await conn.secured_conn.write(_PING)  # the late bytes
                while True:
                    message = msg.decode_frame(await read_frame(stream, 1 << 16))
                    frames.append(f"error:{message.code}" if isinstance(message, msg.Error)
                                  else message.TYPE)
            except TransportError as e:
                if "closed by remote" not in str(e) or conn.is_closed:
                    failure = str(e)  # a torn connection, not the member's end of stream
            except Exception as e:  # noqa: BLE001 - libp2p's errors on a dead connection
                failure = repr(e)
            finally:
                await trio.lowlevel.checkpoint()  # a close already seen counts first
                hung_up = True
                with trio.move_on_after(1):
                    await conn.close()  # we hang up
                nursery.cancel_scope.cancel()
    return Outcome(tuple(frames), failure, closed[0] if closed else None)
