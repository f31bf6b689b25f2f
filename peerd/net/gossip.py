"""The async driver of one gossip session (:mod:`peerd.protocol.session`) over any framed
byte stream.

The order of the exchange (Hello, Manifest, Addrs, Digest, Want, then the entries, initiator
first at every turn, strictly one side writing at a time) and what the peer may send when are
:class:`peerd.protocol.session.Session`'s; see its docstring. This module does what the
session asks, one step at a time, and brings in what needs the node or the event loop:

- reading and writing frames (``FrameIO``: the transport adds the length prefix and the
  deadlines), the frame limit of each read coming from the session;
- the node's decisions: the address records we hand on and those we take
  (``peerd.node.addrbook``, members only, each verified against its subject's key),
  our Digest, our Want (a metadata-only cache merge), the manifest
  (verified against the fleet's admin key and adopted), the peer's membership (decided
  before anything of the fleet goes out, our manifest included), what we send (what the
  peer asked for that we still hold);
- deadlines the session implies: a peer gets :data:`MANIFEST_TIMEOUT_S`, not the
  transport's read timeout, to send the newer manifest its Hello claimed;
- memory: each received entry is spooled to disk as it arrives (``SessionContext``), takes
  one of the shared receive slots (peers take turns; the entry must keep a minimum rate), is
  verified in a worker thread (signature, membership, hash, schema, finite values, norm)
  and merged on the loop thread; a mapped entry is sent
  piece by piece, each piece released once written.

Any :class:`ProtocolError` is counted under its reason, answered with an ``Error`` frame when
possible, and ends only this session: the caller closes just this stream. This module must
not decide the order of the exchange, nor parse frames itself.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from peerd.core.reasons import Reason
from peerd.net.framing import (
    MIN_RECEIVE_RATE_BPS,
    RECEIVE_GRACE_S,
    AfterPart,
    FrameSink,
    FrameTooLargeError,
    RateFloor,
    ReceiveTooSlowError,
)
from peerd.node.addrbook import AddressBook, Learned
from peerd.node.inflight import InFlight
from peerd.node.state import Held, NodeState, digest_item
from peerd.protocol import messages as msg
from peerd.protocol.errors import PeerRefusedError, ProtocolError
from peerd.protocol.ledger import EquivocationError
from peerd.protocol.manifest import accept_manifest
from peerd.protocol.session import CheckPeer, Done, Phase, Send, Session
from peerd.store.partials import Partials
from peerd.store.sinks import MemorySink
from peerd.store.spool import Cut, MappedFrame, SpoolWriter, send_parts

log = logging.getLogger(__name__)

#: Capabilities we announce; none are required, the field lets versions negotiate. The
#: address exchange's (msg.ADDRS_CAPABILITY) is added when the node keeps an address book.
CAPABILITIES = ("entries/v1",)
#: How long a peer may take to send the newer manifest its Hello claimed (then:
#: ``manifest_withheld``). Bounds a peer that claims a huge ``manifest_seq`` to hold one of
#: our sessions (a task, a stream) for the transport's 30 s read timeout while we wait for a
#: manifest it cannot or will not produce: a stranger, and a member too (issue 24: a member
#: held the session 30 s with no counter). A genuine sender, a newcomer admitted in a
#: manifest we have not seen or a member that saw it first, sends it right after the
#: Hellos: one Manifest frame of at most 256 KiB (MAX_MANIFEST_FRAME_LEN), a second at the
#: slowest rate the transport allows.
MANIFEST_TIMEOUT_S = 5.0
#: The name of before issue 24, when only strangers were held to it.
STRANGER_MANIFEST_TIMEOUT_S = MANIFEST_TIMEOUT_S


class FrameIO(Protocol):
    """A reliable, ordered stream of frames (the transport adds the length prefix).

    ``recv`` with a ``sink`` writes the body to it as the bytes arrive: the receive rate floor
    counts what reaches the sink (peerd.net.framing.RateFloor)."""

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
    #: Set when the peer refused *us* as a member (not_member, revoked, expired).
    refused_as: str | None = None


class ReceiveSlots:
    """The receive slots all sessions share, taken in turn by peer.

    The sessions of one peer wait for a slot one at a time (its other sessions wait behind
    it on the peer's own lock), so a member with 8 streams queues once, not 8 times, ahead of
    the others: trio's semaphore and lock are FIFO. With the rate floor that bounds each
    turn (``SessionContext.min_receive_rate_bps``), one member delays another's entry by at
    most one turn per slot, not by one turn per stream it opened.
    """

    def __init__(self, slots: int) -> None:
        self._slots = trio.Semaphore(slots)
        self._turns: dict[str, tuple[trio.Lock, int]] = {}  # peer: (its turn, sessions in it)

    @asynccontextmanager
    async def hold(self, peer: str) -> AsyncIterator[None]:
        lock, users = self._turns.get(peer, (trio.Lock(), 0))
        self._turns[peer] = (lock, users + 1)
        try:
            async with lock, self._slots:
                yield
        finally:
            lock, users = self._turns[peer]
            if users == 1:
                del self._turns[peer]  # the table holds only peers waiting or receiving
            else:
                self._turns[peer] = (lock, users - 1)


@dataclass(frozen=True, slots=True)
class SessionContext:
    admin_key: bytes
    now: Callable[[], float]
    #: Called after a newer manifest was adopted (the daemon persists it).
    on_manifest: Callable[[msg.ManifestMessage], None] = lambda m: None
    #: Shared by all sessions: entries being received at once, each a model-sized frame
    #: (a temporary file with ``spool_dir``, else memory) until it is verified and cached.
    #: Without it, C peers sending at the same time would cost C frames at once and split
    #: the CPU that verification needs. None = no limit. :class:`ReceiveSlots` (the daemon's)
    #: also makes peers take turns; a plain semaphore is first come, first served.
    receive_slots: ReceiveSlots | trio.Semaphore | None = None
    #: Slowest average rate (bytes/s) at which an entry may arrive once it holds a slot, after
    #: ``receive_grace_s``; below it the stream is cut (``too_slow``) and the slot freed, so
    #: a member trickling entries cannot stall everybody's delivery (peerd.net.framing).
    #: 0 = no floor.
    min_receive_rate_bps: float = MIN_RECEIVE_RATE_BPS
    receive_grace_s: float = RECEIVE_GRACE_S
    #: Where received entry frames are written as they arrive (the state directory's
    #: ``blobs/``, see peerd.store.spool); None = into memory.
    spool_dir: Path | None = None
    #: Shared by all sessions: an (origin, version) another session already asked for is
    #: left out of our Want, so a new version offered by several peers at once crosses the
    #: link once (peerd.node.inflight). None = every session asks for all it wants.
    inflight: InFlight | None = None
    #: The members' address records we hand on and take in (the session's Addrs turn, with
    #: peers that announce it too). None = no address exchange (the v1 session).
    address_book: AddressBook | None = None
    #: Called with the records a session took into the book (the daemon feeds its peer
    #: table and saves the book).
    on_addrs: Callable[[list[Learned]], None] = lambda learned: None
    #: Entry transfers that were cut, resumed from where they stopped with peers that
    #: announce it too (peerd.store.partials; needs ``spool_dir``). None = fetched whole.
    partials: Partials | None = None


def _is_member(node: NodeState, now: float) -> Callable[[str], bool]:
    def member(node_id: str) -> bool:
        try:
            node.manifest.check_member(node_id, now)
        except ProtocolError:
            return False
        return True

    return member


async def run_session(
    io: FrameIO, node: NodeState, ctx: SessionContext, *, peer_id: str, initiator: bool
) -> SessionResult:
    """Run one exchange with ``peer_id`` (already authenticated by the transport)."""
    result = SessionResult(peer_id)
    # Our Hello names the seq of the manifest we can hand on (0 if we hold no signed one).
    envelope = node.manifest_envelope
    caps = CAPABILITIES if ctx.address_book is None else \
        (*CAPABILITIES, msg.ADDRS_CAPABILITY, msg.CIRCUITS_CAPABILITY,
         msg.RELAYREC_CAPABILITY)
    if ctx.partials is not None and ctx.spool_dir is not None:
        caps = (*caps, msg.RESUME_CAPABILITY)
    session = Session(
        initiator=initiator,
        hello=msg.Hello(node.fleet_id, node.id, node.manifest.seq if envelope is not None else 0,
                        caps),
        peer_id=peer_id,
        manifest=msg.ManifestMessage(envelope) if envelope is not None else None,
        entry_frame_limit=node.entry_frame_limit(),
    )
    try:
        await _exchange(io, node, ctx, session, result)
    except (FrameTooLargeError, ReceiveTooSlowError) as exc:  # ProtocolErrors, torn streams
        # A length prefix above the limit, or an entry arriving below the minimum rate, is a
        # refusal like any other (counted, audited by the caller), not a mere transport
        # failure. The stream is desynchronised (the body was not read, or only part of it),
        # so no Error frame: reset it where the stream can be reset.
        session.fail(exc)
        _refused(node, result, exc.reason)
        log.info("session with %s ended: %s", peer_id, exc)
        reset = getattr(io, "reset", None)
        if reset is not None:
            await reset()
    except ProtocolError as exc:
        _refused(node, result, exc.reason)
        log.info("session with %s ended: %s", peer_id, exc)
        if isinstance(exc, PeerRefusedError) and exc.membership is not None:
            result.refused_as = str(exc.membership)
        try:
            with trio.move_on_after(1):
                await io.send(session.fail(exc))
        # Best effort: the stream may already be gone, and py-libp2p's errors on a dead
        # stream have no common base; the session's outcome is already decided.
        except Exception as send_exc:  # noqa: BLE001
            log.debug("could not tell %s why: %s", peer_id, send_exc)
    finally:
        if ctx.inflight is not None:  # what did not arrive may be fetched from others
            ctx.inflight.release(id(session))
        if ctx.partials is not None:  # and what it did not finish, resumed by another
            ctx.partials.release(id(session))
    return result


def _refused(node: NodeState, result: SessionResult, reason: Reason) -> None:
    node.reject(reason)
    result.refused[str(reason)] = result.refused.get(str(reason), 0) + 1


async def _exchange(
    io: FrameIO, node: NodeState, ctx: SessionContext, session: Session, result: SessionResult
) -> None:
    """Do what the session asks, step by step; the node makes every decision it needs."""
    outgoing: deque[Held] = deque()  # what we announced, in the order we send it
    while not isinstance(step := session.next_step(), Done):
        if isinstance(step, CheckPeer):
            node.manifest.check_member(session.peer_id, ctx.now())  # NOT_MEMBER / REVOKED / ..
            session.peer_admitted()
        elif isinstance(step, Send) and step.phase is Phase.ENTRY:
            await _send_held(io, session, outgoing.popleft(), resumes=session.resumes)
            result.sent += 1
        elif isinstance(step, Send):
            if step.phase is Phase.ANNOUNCE:
                outgoing = deque(node.to_send(session.their_want))  # the asker's order
            message = step.message
            if message is None:  # not ours yet: the node builds it now
                message = _build(node, ctx, session, step.phase, outgoing)
            await io.send(session.send(message))
        elif step.phase is Phase.ENTRY:
            await _receive_entry(io, node, ctx, session, step.max_len, result)
        elif step.phase is Phase.MANIFEST:
            frame = await _recv_manifest(io, node, ctx, session, step.max_len)
            received = session.receive(frame)
            if isinstance(received, msg.ManifestMessage):
                _adopt_manifest(node, ctx, received, result)
        elif step.phase is Phase.ADDRS:
            received = session.receive(await io.recv(step.max_len))
            if isinstance(received, msg.Addrs) and ctx.address_book is not None:
                # At most MAX_ADDR_RECORDS signature checks (~60 µs each): on the loop thread.
                now = ctx.now()
                ctx.on_addrs(ctx.address_book.receive(received.records, now,
                                                      _is_member(node, now)))
        else:
            session.receive(await io.recv(step.max_len))


def _build(
    node: NodeState, ctx: SessionContext, session: Session, phase: Phase,
    outgoing: deque[Held],
) -> msg.Message:
    """The message the node owes for ``phase``, computed when it is sent."""
    if phase is Phase.DIGEST:
        return node.digest()
    if phase is Phase.ADDRS:  # only announced with a book: the session asks only then
        assert ctx.address_book is not None
        now = ctx.now()
        return msg.Addrs(ctx.address_book.outgoing(now, _is_member(node, now),
                                                   exclude=session.peer_id,
                                                   circuits=session.takes_circuits,
                                                   relays=session.takes_relay_records))
    if phase is Phase.WANT:
        # A metadata-only cache merge: only entries that would survive τ_max and C are asked
        # for, freshest first. The session keeps it: the peer's announcement is checked
        # against what we sent, never a recomputed Want.
        want = node.wants(session.their_digest, ctx.now())
        if ctx.inflight is not None:
            # Claimed until this session ends (run_session's finally); id(session) is unique
            # while it runs.
            want = msg.Want(ctx.inflight.claim(id(session), want.items))
        if ctx.partials is not None and session.resumes:  # the rest of what was cut
            want = ctx.partials.resume(id(session), want, session.their_digest)
        return want
    if phase is Phase.ANNOUNCE:
        return msg.Digest(tuple(digest_item(h.entry.meta) for h in outgoing))
    raise AssertionError(f"the session holds the {phase.value} message itself")


async def _recv_manifest(
    io: FrameIO, node: NodeState, ctx: SessionContext, session: Session, limit: int
) -> bytes | bytearray | memoryview:
    """The manifest frame the peer's Hello promised, within MANIFEST_TIMEOUT_S: a member of
    ours proves its claim as fast as anyone else (it is one frame, sent right away)."""
    try:
        node.manifest.check_member(session.peer_id, ctx.now())
        who = f"a member under manifest {node.manifest.seq}"
    except ProtocolError:  # a stranger, or a newcomer admitted in the manifest it will send
        who = f"not a member under manifest {node.manifest.seq}"
    with trio.move_on_after(MANIFEST_TIMEOUT_S):
        return await io.recv(limit)
    raise ProtocolError(
        Reason.MANIFEST_WITHHELD,
        f"{who}, and no manifest {session.their_hello.manifest_seq} within "
        f"{MANIFEST_TIMEOUT_S:g} s")


def _adopt_manifest(
    node: NodeState, ctx: SessionContext, m: msg.ManifestMessage, result: SessionResult
) -> None:
    manifest = accept_manifest(node.manifest, m.envelope, ctx.admin_key, node.fleet_id)
    node.install_manifest(manifest, m.envelope, ctx.now())
    ctx.on_manifest(m)
    result.manifest_adopted = manifest.seq


async def _send_held(io: FrameIO, session: Session, held: Held, *, resumes: bool) -> None:
    """An entry as held: a mapped one piece by piece, each piece released once written;
    only the rest of it where the peer asked to resume a cut transfer."""
    message = held.message
    if resumes:
        meta = held.entry.meta
        offset = session.their_want.offset_of(meta.origin, meta.version)
        if 0 < offset < len(message.payload):  # else (not ours to judge) the whole entry
            message = msg.Entry(message.envelope, memoryview(message.payload)[offset:], offset)
    parts = session.send(message)
    if held.frame is None:
        await io.send(parts)
        return
    # Same bytes, other pieces: the head the session returned, then the mapping's pages.
    # (parts[0], the head, is already bytes: bytes() of it is the same object, no copy.)
    pieces, written = send_parts(bytes(parts[0]), held.frame, message.payload)
    del parts
    try:
        await io.send(pieces, after_part=written)
    finally:
        held.frame.release()


async def read_entry(
    io: FrameIO, limit: int, spool_dir: Path | None,
    decode: Callable[[bytes | bytearray | memoryview], msg.Message] = msg.decode_frame,
    *, min_rate_bps: float = 0, grace_s: float = RECEIVE_GRACE_S, peer: str = "peer",
    on_cut: Callable[[Cut], object] | None = None,
) -> tuple[msg.Entry, MappedFrame | None]:
    """One entry frame, not yet verified: written to a temporary file in ``spool_dir`` as it
    arrives and mapped (peerd.store.spool), or in memory (no spool, or the disk refused it).
    A session decodes with its ``receive`` (which also checks that an entry may come now).
    With ``min_rate_bps`` the frame must arrive at that average rate after ``grace_s``
    (:class:`peerd.net.framing.RateFloor`), else :class:`ReceiveTooSlowError`.
    ``on_cut`` gets what was spooled of a frame that ended early (it owns the file)."""
    sink = SpoolWriter(spool_dir, keep_cut=on_cut is not None) if spool_dir is not None else None
    try:
        if min_rate_bps > 0:
            with RateFloor(min_rate_bps, grace_s, peer) as floor:
                frame = await io.recv(limit, sink=floor.sink(sink or MemorySink()))
        else:
            frame = await io.recv(limit, sink=sink)
    finally:
        if sink is not None and sink.cut is not None and on_cut is not None:
            on_cut(sink.cut)
    message = decode(frame)
    del frame  # the message's views keep the buffer alive only while they are needed
    if not isinstance(message, msg.Entry):
        raise ProtocolError(Reason.MALFORMED, f"expected entry, got {message.TYPE}")
    return message, (sink.frame if sink is not None else None)


async def _resumed(
    ctx: SessionContext, session: Session, tail: msg.Entry,
) -> tuple[msg.Entry, MappedFrame]:
    """The whole entry frame: the kept bytes of a cut transfer and ``tail``, the rest (the
    session checked that we asked for exactly this offset). Verified by the caller as any
    entry; a partial that does not fit its tail is dropped and the entry refused."""
    item = session.announced_entry
    partial = (None if ctx.partials is None
               else ctx.partials.take(id(session), item.origin, item.version))
    if partial is None or partial.have != tail.offset:  # asked only for what we claimed
        raise ProtocolError(Reason.MALFORMED, "entry offset for no transfer we kept")
    try:
        whole = await trio.to_thread.run_sync(partial.complete, tail.payload)
    except (ValueError, OSError) as exc:
        partial.unlink()
        raise ProtocolError(Reason.PAYLOAD_MISMATCH, f"cannot resume: {exc}") from exc
    message = msg.decode_frame(whole.body)
    if not isinstance(message, msg.Entry) or message.offset:
        raise ProtocolError(Reason.MALFORMED, "a kept transfer is not an entry")
    log.info("resumed %s@%d from byte %d of %d", item.origin[:16], item.version,
             partial.have, partial.payload_len)
    return message, whole


async def _receive_entry(
    io: FrameIO, node: NodeState, ctx: SessionContext, session: Session, limit: int,
    result: SessionResult,
) -> None:
    # The sender blocks on flow control while we wait for a slot: nothing piles up here
    # (Yamux's initial 256 KiB at most; mend 10 grows a window only once it is read).
    slots = ctx.receive_slots
    slot: AbstractAsyncContextManager[object] = (
        slots.hold(session.peer_id) if isinstance(slots, ReceiveSlots) else slots or nullcontext())
    async with slot:
        message, mapped = await read_entry(
            io, limit, ctx.spool_dir, decode=session.receive,
            min_rate_bps=ctx.min_receive_rate_bps, grace_s=ctx.receive_grace_s,
            peer=session.peer_id,
            on_cut=None if ctx.partials is None or not session.resumes else ctx.partials.keep)
        if message.offset:  # the rest of a cut transfer: joined to the bytes we kept
            del mapped  # the tail's spooled file goes once the tail is copied
            message, mapped = await _resumed(ctx, session, message)
        # The worker gets immutable snapshots, taken here on the loop thread: the live
        # ledger (and manifest) may change meanwhile and are never touched from the worker.
        check = node.verifier(message, mapped, ctx.now())
        try:
            verified = await trio.to_thread.run_sync(check)
        except ProtocolError as exc:
            # One bad entry does not end the session: count it and read the next frame.
            if isinstance(exc, EquivocationError):
                node.flag(exc.origin)  # proven in the worker, flagged on this thread
            _refused(node, result, exc.reason)
            log.info("refused entry from %s via %s: %s", session.announced_entry.origin[:16],
                     session.peer_id[:16], exc)
            return
        finally:
            del message, mapped, check  # a refused spooled entry's file goes with its mapping
        meta = verified.entry.meta
        session.check_entry(meta.origin, meta.version)
        reason = node.accept(verified, sender=session.peer_id, now=ctx.now())
        del verified  # refused: its buffer goes back before the slot does
    if reason is None:
        result.received += 1
    else:
        result.refused[str(reason)] = result.refused.get(str(reason), 0) + 1
