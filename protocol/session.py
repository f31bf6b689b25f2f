"""One gossip session as a sans-IO state machine: the order of the exchange and nothing else.

Like h11's ``Connection``, it holds no socket and never waits: the driver
(:mod:`peerd.net.gossip`, or a test) asks :meth:`Session.next_step` what comes next, then
either sends the frame body that :meth:`Session.send` returns, reads one frame of at most
``Receive.max_len`` bytes and hands it to :meth:`Session.receive`, or makes a decision that
needs the node and reports it. The turn order, which the wire format of v1 fixes:

1. ``Hello`` both ways, initiator first. The peer's Hello is judged only once ours went out
   (so a refused peer still learns who we are): same fleet, and the node id the transport
   handshake authenticated.
2. :class:`CheckPeer`: the node decides whether the peer is an active member under the
   manifest it holds, and reports it with :meth:`Session.peer_admitted`. The side that
   announced the higher ``manifest_seq`` decides first, under that (newer) manifest: the
   manifest lists every member's key, and the fleet id, all a stranger needs to get this
   far, is public (mDNS publishes it). Nothing of the fleet is queued before admission.
3. ``Manifest``: that side, once it admitted the peer, sends its signed manifest (at most
   one frame; none on a tie); the other side's node verifies and adopts it, and only then
   decides (:class:`CheckPeer`) under the manifest it now holds. A newcomer admitted in a
   manifest the other side has not seen is thus judged under the manifest that admits it,
   whichever side it is on.
4. ``Addrs`` both ways, initiator first, only when both Hellos announce
   :data:`~peerd.protocol.messages.ADDRS_CAPABILITY`: the signed address records each side
   holds of members (the node builds ours and judges theirs, record by record). A peer
   that does not announce it gets the session of v1 unchanged.
5. ``Digest`` both ways, initiator first: what each side holds.
6. ``Want`` both ways, initiator first: built by the node from the peer's Digest.
7. Entries: the initiator announces (a ``Digest`` of what follows, only entries the peer
   wanted) and sends them; then the responder does the same. Between peers that both
   announce :data:`~peerd.protocol.messages.RESUME_CAPABILITY`, a Want item may carry the
   payload bytes the asker already holds of it, and the entry may then come as the rest
   only (its ``offset`` exactly what was asked, or 0 for the whole entry). An announcement naming an
   entry we did not ask for (or one twice) ends the session; once an entry is verified it
   must be the one announced at its place (:meth:`Session.check_entry`).

Strictly one side writes at a time, so two flow-controlled streams never both block on a
44 MB write. Control frames are held to :data:`MAX_CONTROL_FRAME_LEN`, the manifest's turn to
:data:`MAX_MANIFEST_FRAME_LEN`; only an entry's turn allows an entry-sized frame.

Owns: the order, the turn-taking, the frame limit of each turn and what the peer may send
when (the peer's misbehaviour is the protocol's one :class:`ProtocolError`; after one the
session stays failed). It must not decide what the node wants, whether a manifest is
accepted or whether an entry is valid (the node does, outside), and must not do I/O, read
the clock or import anything that does: this package has a purity test.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import TypeVar

from peerd.core.reasons import Reason
from peerd.protocol import messages as msg
from peerd.protocol.errors import PeerRefusedError, ProtocolError
from peerd.protocol.limits import (
    MAX_CONTROL_FRAME_LEN,
    MAX_FRAME_LEN_CEILING,
    MAX_MANIFEST_FRAME_LEN,
)


class Phase(enum.Enum):
    """What a step of the session carries."""

    HELLO = "hello"
    MANIFEST = "manifest"
    ADDRS = "addrs"
    DIGEST = "digest"
    WANT = "want"
    ANNOUNCE = "announce"  # a Digest of the entries that follow
    ENTRY = "entry"


#: The message type each phase carries.
EXPECTED: dict[Phase, type[msg.Message]] = {
    Phase.HELLO: msg.Hello,
    Phase.MANIFEST: msg.ManifestMessage,
    Phase.ADDRS: msg.Addrs,
    Phase.DIGEST: msg.Digest,
    Phase.WANT: msg.Want,
    Phase.ANNOUNCE: msg.Digest,
    Phase.ENTRY: msg.Entry,
}


@dataclass(frozen=True, slots=True)
class Send:
    """Our turn: pass a message of ``EXPECTED[phase]`` to :meth:`Session.send`.

    ``message`` is set when the session already holds it (our Hello and manifest); otherwise
    the node builds it (Addrs: the records it holds of members; Digest: what it holds;
    Want: from :attr:`Session.their_digest`;
    announcement and entries: what :attr:`Session.their_want` asked for that it still holds).
    """

    phase: Phase
    message: msg.Message | None = None


@dataclass(frozen=True, slots=True)
class Receive:
    """Their turn: read one frame of at most ``max_len`` bytes, give it to
    :meth:`Session.receive`."""

    phase: Phase
    max_len: int


@dataclass(frozen=True, slots=True)
class CheckPeer:
    """The node decides whether the peer may gossip (an active member under the manifest it
    holds now); it raises ``ProtocolError`` or calls :meth:`Session.peer_admitted`."""


@dataclass(frozen=True, slots=True)
class Done:
    """The session is complete; nothing more is sent or read."""


Step = Send | Receive | CheckPeer | Done
_S = TypeVar("_S", Send, Receive, CheckPeer)
_T = TypeVar("_T")


class SessionStateError(RuntimeError):
    """The driver did something the order does not allow: a bug on our side, never the
    peer's fault, so it is not counted as a refusal of the peer."""


class Session:
    """The state of one session with ``peer_id`` (authenticated by the transport).

    ``hello`` is ours; ``manifest`` is the signed manifest that its ``manifest_seq`` names
    (None when we hold none; the Hello then says 0). ``entry_frame_limit`` bounds an entry
    frame (``peerd.protocol.admission.entry_frame_limit`` of the local schema).
    """

    def __init__(
        self,
        *,
        initiator: bool,
        hello: msg.Hello,
        peer_id: str,
        manifest: msg.ManifestMessage | None,
        entry_frame_limit: int,
    ) -> None:
        if not 0 < entry_frame_limit <= MAX_FRAME_LEN_CEILING:
            raise ValueError(f"entry_frame_limit {entry_frame_limit} out of range")
        if manifest is None and hello.manifest_seq != 0:
            # The peer would wait for a manifest we cannot send.
            raise ValueError("without a signed manifest our Hello must announce seq 0")
        self.initiator = initiator
        self.hello = hello
        self.peer_id = peer_id
        self.manifest = manifest
        self._entry_limit = entry_frame_limit
        self._steps: deque[Send | Receive | CheckPeer] = deque(
            self._turn(Phase.HELLO, Send(Phase.HELLO, hello))
        )
        self._judge_hello = False  # set once both Hellos went by; judged in next_step()
        self._send_manifest: msg.ManifestMessage | None = None  # ours, once the peer is admitted
        self._failed = False
        self._their_hello: msg.Hello | None = None
        self._their_digest: msg.Digest | None = None
        self._their_want: msg.Want | None = None
        self._my_want: msg.Want | None = None
        self._announced: deque[msg.DigestItem] = deque()  # theirs, not yet received
        self._last_entry: msg.DigestItem | None = None  # the announcement of the last entry
        self._sending: deque[msg.DigestItem] = deque()  # ours, not yet sent

    # ------------------------------------------------------------------ what comes next
    def next_step(self) -> Step:
        """The next thing to do. Raises :class:`ProtocolError` when the Hello exchange that
        just ended revealed a peer we must refuse."""
        self._usable()
        if self._judge_hello:
            self._judge_hello = False
            self._after_hellos()
        return self._steps[0] if self._steps else Done()

    @property
    def done(self) -> bool:
        return not self._failed and not self._judge_hello and not self._steps

    # ------------------------------------------------------------------ our side
    def send(self, message: msg.Message) -> list[bytes | memoryview]:
        """Record that ``message`` goes out now; returns its frame body as parts (the head
        first, then an entry's payload uncopied). The transport adds the length prefix."""
        step = self._current(Send, type(message).__name__)
        expected = EXPECTED[step.phase]
        if type(message) is not expected:
            raise SessionStateError(f"{step.phase.value}: cannot send {message.TYPE} now")
        if step.message is not None and message != step.message:
            raise SessionStateError(f"{step.phase.value}: not the message the session holds")
        if step.phase is Phase.ANNOUNCE and isinstance(message, msg.Digest):
            asked = set(self.their_want.items)
            if any((i.origin, i.version) not in asked for i in message.entries):
                raise SessionStateError("announcing an entry the peer did not ask for")
        if isinstance(message, msg.Want) and message.resumes and not self.resumes:
            raise SessionStateError("offsets in a Want to a peer that does not resume")
        if isinstance(message, msg.Entry) and message.offset:
            item = self._outgoing_entry(message)
            if message.offset != self.their_want.offset_of(*item):
                raise SessionStateError("an entry's offset must be the one the peer asked for")
        self._steps.popleft()
        if isinstance(message, msg.Want):
            self._my_want = message
        elif step.phase is Phase.ANNOUNCE and isinstance(message, msg.Digest):
            self._steps.extendleft(Send(Phase.ENTRY) for _ in message.entries)
            self._sending = deque(message.entries)
        elif isinstance(message, msg.Entry):
            self._sending.popleft()
        self._after_step(step.phase)
        if isinstance(message, msg.Entry):
            return [message.head(), memoryview(message.payload)]
        return [message.head()]

    def peer_admitted(self) -> None:
        """The node found the peer an active member: our newer manifest (if any), then the
        Digest exchange, may go out."""
        self._current(CheckPeer, "peer_admitted")
        self._steps.popleft()
        if self._send_manifest is not None:
            self._steps.append(Send(Phase.MANIFEST, self._send_manifest))
        if self.exchanges_addrs:
            self._steps.extend(self._turn(Phase.ADDRS))
        self._steps.extend(self._turn(Phase.DIGEST))
        self._steps.extend(self._turn(Phase.WANT))
        first, second = Send(Phase.ANNOUNCE), self._receive(Phase.ANNOUNCE)
        self._steps.extend((first, second) if self.initiator else (second, first))

    def fail(self, error: ProtocolError) -> list[bytes | memoryview]:
        """End the session because of ``error`` (found here or by the node); returns the
        body of the ``Error`` frame that tells the peer why. Nothing follows it."""
        self._failed = True
        self._steps.clear()
        return [msg.Error(error.code, error.message[:200]).head()]

    # ------------------------------------------------------------------ their side
    def receive(self, frame: bytes | bytearray | memoryview) -> msg.Message:
        """Decode the frame the current :class:`Receive` step read and check that the peer
        may send it now. An entry is returned unverified (its payload a view of ``frame``;
        nothing here keeps a reference to either)."""
        self._usable()
        try:
            return self._receive_frame(frame)
        except ProtocolError:
            self._failed = True
            raise

    def check_entry(self, origin: str, version: int) -> None:
        """The entry last received, once verified, names ``(origin, version)``: it must be
        the one announced at its place."""
        item = self.announced_entry
        if (origin, version) != (item.origin, item.version):
            self._failed = True
            raise ProtocolError(Reason.MALFORMED, "entry differs from its announcement")

    # ------------------------------------------------------------------ what we learned
    @property
    def their_hello(self) -> msg.Hello:
        return _known(self._their_hello, "their Hello")

    @property
    def exchanges_addrs(self) -> bool:
        """Both Hellos announce the address exchange (known once the Hellos went by)."""
        cap = msg.ADDRS_CAPABILITY
        return cap in self.hello.capabilities and cap in self.their_hello.capabilities

    @property
    def takes_circuits(self) -> bool:
        """The peer's Hello says it takes records holding circuit addresses."""
        return msg.CIRCUITS_CAPABILITY in self.their_hello.capabilities

    @property
    def takes_relay_records(self) -> bool:
        """The peer's Hello says it takes records with the ``relay`` field."""
        return msg.RELAYREC_CAPABILITY in self.their_hello.capabilities

    @property
    def resumes(self) -> bool:
        """Both Hellos announce resuming cut transfers (known once the Hellos went by)."""
        cap = msg.RESUME_CAPABILITY
        return cap in self.hello.capabilities and cap in self.their_hello.capabilities

    @property
    def their_digest(self) -> msg.Digest:
        return _known(self._their_digest, "their Digest")

    @property
    def their_want(self) -> msg.Want:
        return _known(self._their_want, "their Want")

    @property
    def my_want(self) -> msg.Want:
        """The Want we sent: the peer may send exactly what it asked for. Never recomputed:
        a concurrent session can move the cache meanwhile, and checking an announcement
        against a Want the peer never saw refused honest peers as malformed."""
        return _known(self._my_want, "our Want")

    @property
    def announced_entry(self) -> msg.DigestItem:
        """The announcement line of the entry last received."""
        return _known(self._last_entry, "a received entry")

    # ------------------------------------------------------------------ internals
    def _outgoing_entry(self, entry: msg.Entry) -> tuple[str, int]:
        """The (origin, version) of the entry we send next, as we announced it (a resumed
        entry's offset is checked against the peer's Want for it)."""
        if not self._sending:
            raise SessionStateError("an entry beyond our announcement")
        item = self._sending[0]
        return item.origin, item.version

    def _usable(self) -> None:
        if self._failed:
            raise SessionStateError("the session has failed")

    def _current(self, kind: type[_S], what: str) -> _S:
        self._usable()
        if self._judge_hello or not self._steps:
            raise SessionStateError(f"{what}: call next_step() first")
        step = self._steps[0]
        if not isinstance(step, kind):
            raise SessionStateError(f"{what}: the session expects {step}")
        return step

    def _receive(self, phase: Phase) -> Receive:
        if phase is Phase.ENTRY:
            return Receive(phase, self._entry_limit)
        if phase is Phase.MANIFEST:  # a fleet's member list may outgrow a control frame
            return Receive(phase, MAX_MANIFEST_FRAME_LEN)
        return Receive(phase, MAX_CONTROL_FRAME_LEN)

    def _turn(self, phase: Phase, mine: Send | None = None) -> list[Send | Receive]:
        """Both directions of one phase, the initiator's first."""
        ours, theirs = mine or Send(phase), self._receive(phase)
        return [ours, theirs] if self.initiator else [theirs, ours]

    def _after_step(self, phase: Phase) -> None:
        if phase is Phase.HELLO and not self._steps:
            self._judge_hello = True

    def _after_hellos(self) -> None:
        theirs = self.their_hello
        if theirs.fleet_id != self.hello.fleet_id:
            self._failed = True
            raise ProtocolError(Reason.WRONG_FLEET, "peer belongs to another fleet")
        if theirs.node_id != self.peer_id:
            self._failed = True
            raise ProtocolError(Reason.BAD_SIGNATURE, "Hello names a node other than the handshake")
        # Whoever holds the higher seq sends its manifest (at most one side does), but only
        # to a peer its node admitted (peer_admitted queues it): a stranger gets an Error.
        seq = self.hello.manifest_seq
        if self.manifest is not None and seq > theirs.manifest_seq:
            self._send_manifest = self.manifest
        elif theirs.manifest_seq > seq:
            self._steps.append(self._receive(Phase.MANIFEST))  # judged under it, once adopted
        self._steps.append(CheckPeer())

    def _receive_frame(self, frame: bytes | bytearray | memoryview) -> msg.Message:
        if self._judge_hello or not self._steps or not isinstance(self._steps[0], Receive):
            # The peer broke the turn-taking (or kept talking after the end): no driver reads
            # then, but a sans-IO user that reads eagerly must refuse it all the same.
            got = msg.decode_frame(frame).TYPE
            raise ProtocolError(Reason.MALFORMED, f"{got} frame while it is not the peer's turn")
        step = self._steps[0]
        if len(frame) > step.max_len:
            raise ProtocolError(
                Reason.TOO_LARGE, f"{step.phase.value} frame of {len(frame)} bytes "
                f"exceeds limit {step.max_len}")
        message = msg.decode_frame(frame)
        expected = EXPECTED[step.phase]
        if step.phase is not Phase.ENTRY and isinstance(message, msg.Error):
            raise PeerRefusedError(message.code, message.text)
        if not isinstance(message, expected):
            raise ProtocolError(Reason.MALFORMED, f"expected {expected.TYPE}, got {message.TYPE}")
        self._steps.popleft()
        if isinstance(message, msg.Hello):
            self._their_hello = message
        elif isinstance(message, msg.Want):
            if message.resumes and not self.resumes:
                raise ProtocolError(Reason.MALFORMED,
                                    f"want offsets without {msg.RESUME_CAPABILITY}")
            self._their_want = message
        elif isinstance(message, msg.Digest) and step.phase is Phase.DIGEST:
            self._their_digest = message
        elif isinstance(message, msg.Digest):  # their announcement
            self._announce(message)
        elif isinstance(message, msg.Entry):
            self._last_entry = item = self._announced.popleft()
            # The rest of a cut transfer only where we asked for it, from where we asked.
            if message.offset and message.offset != self.my_want.offset_of(item.origin,
                                                                            item.version):
                raise ProtocolError(Reason.MALFORMED,
                                    f"entry offset {message.offset} was not asked for")
        self._after_step(step.phase)
        return message

    def _announce(self, announce: msg.Digest) -> None:
        wanted = set(self.my_want.items)
        for item in announce.entries:
            if (item.origin, item.version) not in wanted:
                raise ProtocolError(Reason.MALFORMED, "peer announced an entry we did not ask for")
            wanted.discard((item.origin, item.version))
        self._announced = deque(announce.entries)
        self._steps.extendleft(self._receive(Phase.ENTRY) for _ in announce.entries)


def _known(value: _T | None, what: str) -> _T:
    if value is None:
        raise SessionStateError(f"{what} is not known yet")
    return value
