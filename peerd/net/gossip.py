"""One anti-entropy session between two connected nodes, over any framed byte stream.

The exchange is strictly turn-based so that neither side ever writes 44 MB while the other
is also writing (which would deadlock two flow-controlled streams):

1. ``Hello`` both ways: same fleet, and the node id must be the one the transport handshake
   authenticated (discovery and Hello are hints; the Noise handshake is the proof).
2. ``Manifest``: whoever holds the higher ``seq`` sends it; the other verifies it against the
   fleet's admin key and adopts it. Then the peer must be an active member, or we close.
3. ``Digest`` both ways: (origin, version, created_at, payload hash) for every held entry.
4. ``Want`` both ways: computed by a metadata-only cache merge, so only entries that would
   survive τ_max and C are requested, freshest first.
5. Entries: the initiator announces (a ``Digest`` of what follows) and sends what was wanted;
   then the responder does the same. Each received entry is verified in a worker thread
   (signature, membership, hash, schema, finite values, norm) and merged on the loop thread.

Any :class:`ProtocolError` is counted under its reason, answered with an ``Error`` frame when
possible, and ends only this session: the caller closes just this stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import trio

from peerd.core.reasons import Reason
from peerd.net.framing import AfterPart, FrameSink, FrameTooLargeError
from peerd.node.state import Held, NodeState, verify, wire_schema
from peerd.protocol import messages as msg
from peerd.protocol.admission import entry_frame_limit
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN
from peerd.protocol.manifest import accept_manifest
from peerd.store.spool import MappedFrame, SpoolWriter, send_parts

log = logging.getLogger(__name__)

#: Capabilities we announce; none are required yet, the field lets future versions negotiate.
CAPABILITIES = ("entries/v1",)

M = TypeVar("M", bound=msg.Hello | msg.Digest | msg.Want | msg.ManifestMessage)


class FrameIO(Protocol):
    """A reliable, ordered stream of frames (the transport adds the length prefix)."""

    async def send(
        self, parts: Sequence[bytes | memoryview], after_part: AfterPart | None = None
    ) -> None: ...

    async def recv(
        self, max_len: int, sink: FrameSink | None = None
    ) -> bytes | bytearray | memoryview: ...


@dataclass
class SessionResult:
    peer: str
    sent: int = 0
    received: int = 0  # entries that entered the cache
    refused: dict[str, int] = field(default_factory=dict)  # by reason
    manifest_adopted: int | None = None  # seq adopted from the peer


@dataclass(frozen=True, slots=True)
class SessionContext:
    admin_key: bytes
    now: Callable[[], float]
    #: Called after a newer manifest was adopted (the daemon persists it).
    on_manifest: Callable[[msg.ManifestMessage], None] = lambda m: None
    #: Shared by all sessions: entries being received at once, each a model-sized frame
    #: (a temporary file with ``spool_dir``, else memory) until it is verified and cached.
    #: Without it, C peers sending at the same time would cost C frames at once and split
    #: the CPU that verification needs. None = no limit.
    receive_slots: trio.Semaphore | None = None
    #: Where received entry frames are written as they arrive (the state directory's
    #: ``blobs/``, see peerd.store.spool); None = into memory.
    spool_dir: Path | None = None


async def _recv(io: FrameIO, expected: type[M]) -> M:
    frame = await io.recv(MAX_CONTROL_FRAME_LEN)
    message = msg.decode_frame(frame)
    if isinstance(message, msg.Error):
        raise ProtocolError(Reason.MALFORMED, f"peer refused: {message.code} {message.text}")
    if not isinstance(message, expected):
        raise ProtocolError(Reason.MALFORMED, f"expected {expected.TYPE}, got {message.TYPE}")
    return message


async def _send(io: FrameIO, message: msg.Message) -> None:
    if isinstance(message, msg.Entry):
        await io.send([message.head(), memoryview(message.payload)])
    else:
        await io.send([message.head()])


async def _turn(io: FrameIO, initiator: bool, mine: M, expected: type[M]) -> M:
    """Send ours and receive theirs, initiator first."""
    if initiator:
        await _send(io, mine)
        return await _recv(io, expected)
    theirs = await _recv(io, expected)
    await _send(io, mine)
    return theirs


async def run_session(
    io: FrameIO, node: NodeState, ctx: SessionContext, *, peer_id: str, initiator: bool
) -> SessionResult:
    """Run one exchange with ``peer_id`` (already authenticated by the transport)."""
    result = SessionResult(peer_id)
    try:
        await _exchange(io, node, ctx, peer_id, initiator, result)
    except ProtocolError as exc:
        node.reject(exc.reason)
        result.refused[str(exc.reason)] = result.refused.get(str(exc.reason), 0) + 1
        log.info("session with %s ended: %s", peer_id, exc)
        try:
            with trio.move_on_after(1):
                await _send(io, msg.Error(exc.code, exc.message[:200]))
        except Exception as send_exc:  # best effort: the stream may already be gone
            log.debug("could not tell %s why: %s", peer_id, send_exc)
    except FrameTooLargeError as exc:
        # A length prefix above the limit is a refusal like any other (counted, audited by
        # the caller), not a mere transport failure. The stream is desynchronised (the body
        # was not read), so no Error frame: reset it where the stream can be reset.
        node.reject(Reason.TOO_LARGE)
        result.refused[str(Reason.TOO_LARGE)] = result.refused.get(str(Reason.TOO_LARGE), 0) + 1
        log.info("session with %s ended: %s", peer_id, exc)
        reset = getattr(io, "reset", None)
        if reset is not None:
            await reset()
    return result


async def _exchange(
    io: FrameIO, node: NodeState, ctx: SessionContext, peer_id: str, initiator: bool,
    result: SessionResult,
) -> None:
    seq = node.manifest.seq if node.manifest_envelope is not None else 0
    hello = msg.Hello(node.fleet_id, node.id, seq, CAPABILITIES)
    theirs = await _turn(io, initiator, hello, msg.Hello)
    if theirs.fleet_id != node.fleet_id:
        raise ProtocolError(Reason.WRONG_FLEET, "peer belongs to another fleet")
    if theirs.node_id != peer_id:
        raise ProtocolError(Reason.BAD_SIGNATURE, "Hello names a node other than the handshake")

    # Manifests: initiator's direction first, then the responder's.
    for sender_is_me in (initiator, not initiator):
        if sender_is_me and seq > theirs.manifest_seq and node.manifest_envelope is not None:
            await _send(io, msg.ManifestMessage(node.manifest_envelope))
        elif not sender_is_me and theirs.manifest_seq > seq:
            m = await _recv(io, msg.ManifestMessage)
            manifest = accept_manifest(node.manifest, m.envelope, ctx.admin_key, node.fleet_id)
            node.install_manifest(manifest, m.envelope, ctx.now())
            ctx.on_manifest(m)
            result.manifest_adopted = manifest.seq
            seq = manifest.seq
    node.manifest.check_member(peer_id, ctx.now())  # NOT_MEMBER / REVOKED / EXPIRED

    their_digest = await _turn(io, initiator, node.digest(), msg.Digest)
    # The peer may send exactly what this Want asked for. It must not be recomputed later:
    # a concurrent session can move the cache meanwhile, and checking the peer's
    # announcement against a Want it never saw refused honest peers as "malformed". An
    # entry no longer needed by the time it arrives is dropped by the ledger as not_newer.
    my_want = node.wants(their_digest, ctx.now())
    their_want = await _turn(io, initiator, my_want, msg.Want)

    for sending in (initiator, not initiator):
        if sending:
            await _send_entries(io, node, their_want, result)
        else:
            await _receive_entries(io, node, ctx, peer_id, my_want, result)


async def _send_entries(
    io: FrameIO, node: NodeState, want: msg.Want, result: SessionResult
) -> None:
    outgoing = node.to_send(want)  # in the asker's order: freshest first
    await _send(io, msg.Digest(tuple(
        msg.DigestItem(h.entry.meta.origin, h.entry.meta.version, h.entry.meta.created_at,
                       bytes.fromhex(h.entry.meta.digest))
        for h in outgoing
    )))
    for held in outgoing:
        await _send_held(io, held)
        result.sent += 1


async def _send_held(io: FrameIO, held: Held) -> None:
    """An entry as held: a mapped one piece by piece, each piece released once written."""
    if held.frame is None:
        await _send(io, held.message)
        return
    parts, written = send_parts(held.message.head(), held.frame, held.message.payload)
    try:
        await io.send(parts, after_part=written)
    finally:
        held.frame.release()


async def read_entry(
    io: FrameIO, limit: int, spool_dir: Path | None
) -> tuple[msg.Entry, MappedFrame | None]:
    """One entry frame, not yet verified: written to a temporary file in ``spool_dir`` as it
    arrives and mapped (peerd.store.spool), or in memory (no spool, or the disk refused it)."""
    sink = SpoolWriter(spool_dir) if spool_dir is not None else None
    frame = await io.recv(limit, sink=sink)
    message = msg.decode_frame(frame)
    del frame  # the message's views keep the buffer alive only while they are needed
    if not isinstance(message, msg.Entry):
        raise ProtocolError(Reason.MALFORMED, f"expected entry, got {message.TYPE}")
    return message, (sink.frame if sink is not None else None)


async def _receive_entries(
    io: FrameIO, node: NodeState, ctx: SessionContext, peer_id: str, want: msg.Want,
    result: SessionResult,
) -> None:
    announce = await _recv(io, msg.Digest)
    wanted = set(want.items)
    limit = entry_frame_limit(wire_schema(node.schema))
    for item in announce.entries:
        if (item.origin, item.version) not in wanted:
            raise ProtocolError(Reason.MALFORMED, "peer announced an entry we did not ask for")
        wanted.discard((item.origin, item.version))
    for item in announce.entries:
        # The sender blocks on flow control while we wait for a slot: nothing piles up here.
        async with ctx.receive_slots or nullcontext():
            message, mapped = await read_entry(io, limit, ctx.spool_dir)
            try:
                verified = await trio.to_thread.run_sync(lambda m=message, f=mapped: verify(
                    m, fleet_id=node.fleet_id, manifest=node.manifest, ledger=node.ledger,
                    schema=node.schema, limits=node.limits, now=ctx.now(), frame=f))
            except ProtocolError as exc:
                # One bad entry does not end the session: count it and read the next frame.
                node.reject(exc.reason)
                result.refused[str(exc.reason)] = result.refused.get(str(exc.reason), 0) + 1
                log.info("refused entry from %s via %s: %s", item.origin[:16], peer_id[:16],
                         exc)
                continue
            finally:
                del message, mapped  # a refused spooled entry's file goes with its mapping
            meta = verified.entry.meta
            if (meta.origin, meta.version) != (item.origin, item.version):
                raise ProtocolError(Reason.MALFORMED, "entry differs from its announcement")
            reason = node.accept(verified, sender=peer_id, now=ctx.now())
            del verified  # refused: its buffer goes back before the slot does
        if reason is None:
            result.received += 1
        else:
            result.refused[str(reason)] = result.refused.get(str(reason), 0) + 1
