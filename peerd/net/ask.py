"""One request and one answer on a fresh libp2p stream, each a varint-prefixed message: the
shape of the libp2p control protocols peerd speaks as a client (rendezvous, AutoNAT).

Only the bytes move here; the caller builds and parses the messages, sets the deadline and
turns failures into its own error, since what a failure means differs (a rendezvous point
gone, a relay that cannot judge our reachability)."""

from __future__ import annotations

from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited


async def ask(host: IHost, peer: ID, protocol: TProtocol, request: bytes, limit: int) -> bytes:
    """Open a ``protocol`` stream to ``peer``, send ``request``, read an answer of at most
    ``limit`` bytes (refused before it is read whole), close the stream."""
    stream = await host.new_stream(peer, [protocol])
    try:
        await stream.write(encode_varint_prefixed(request))
        return await read_varint_prefixed_bytes_limited(stream, limit)
    finally:
        await stream.close()
