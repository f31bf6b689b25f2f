"""The gossip session state machine (peerd.protocol.session) driven with no socket and no
event loop: two machines talk through length-prefixed bytes and FrameDecoders, and hostile
frames are fed to one machine directly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from peerd.core.reasons import Reason
from peerd.protocol import messages as msg
from peerd.protocol.entry import EntryBody
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder, encode_frame
from peerd.protocol.identity import node_id_of
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN, MAX_MANIFEST_FRAME_LEN
from peerd.protocol.manifest import Manifest
from peerd.protocol.session import (
    CheckPeer,
    Done,
    Phase,
    Receive,
    Send,
    Session,
    SessionStateError,
)
from tests.protocol.helpers import ADMIN, ALICE, BOB, FLEET, MALLORY, OTHER_FLEET, entry

A, B = node_id_of(ALICE), node_id_of(BOB)
ENTRY_LIMIT = 1 << 20
#: Signed manifests by seq (the session only carries them; the node verifies them).
SIGNED = {seq: msg.ManifestMessage(Manifest(FLEET, seq).sign(ADMIN)) for seq in (1, 2)}


def item(e: msg.Entry) -> msg.DigestItem:
    body = EntryBody.from_bytes(e.envelope.body)
    return msg.DigestItem(body.origin, body.version, body.created_at, bytes.fromhex(body.digest))


@dataclass
class Peer:
    """A stand-in for the node: holds entries, wants whatever it lacks, admits everyone."""

    session: Session
    held: list[msg.Entry] = field(default_factory=list)
    got: list[msg.Entry] = field(default_factory=list)
    manifests: list[msg.ManifestMessage] = field(default_factory=list)
    admit: Callable[[], None] = lambda: None
    outgoing: list[msg.Entry] = field(default_factory=list)

    def build(self, phase: Phase) -> msg.Message:
        s = self.session
        if phase is Phase.DIGEST:
            return msg.Digest(tuple(item(e) for e in self.held))
        if phase is Phase.WANT:
            mine = {(i.origin, i.version) for i in map(item, self.held)}
            return msg.Want(tuple((i.origin, i.version) for i in s.their_digest.entries
                                  if (i.origin, i.version) not in mine))
        if phase is Phase.ANNOUNCE:
            by_key = {(i.origin, i.version): e for e, i in ((e, item(e)) for e in self.held)}
            self.outgoing = [by_key[k] for k in s.their_want.items if k in by_key]
            return msg.Digest(tuple(item(e) for e in self.outgoing))
        assert phase is Phase.ENTRY
        return self.outgoing.pop(0)


def session(initiator: bool, me: str = A, peer: str = B, *, seq: int = 1,
            fleet: bytes = FLEET, held_manifest: bool = True) -> Session:
    return Session(
        initiator=initiator,
        hello=msg.Hello(fleet, me, seq if held_manifest else 0, ("entries/v1",)),
        peer_id=peer,
        manifest=SIGNED[seq] if held_manifest else None,
        entry_frame_limit=ENTRY_LIMIT,
    )


def run(a: Peer, b: Peer) -> list[tuple[str, str]]:
    """Drive both machines to the end over bytes; returns who sent what, in wire order, and
    when each decided on the other's membership ("check")."""
    wire: dict[str, bytearray] = {"a": bytearray(), "b": bytearray()}  # bytes in flight to x
    decoders = {"a": FrameDecoder(ENTRY_LIMIT), "b": FrameDecoder(ENTRY_LIMIT)}
    sides = {"a": (a, "b"), "b": (b, "a")}
    transcript: list[tuple[str, str]] = []
    inbox: dict[str, list[memoryview]] = {"a": [], "b": []}
    for _ in range(200):
        moved = False
        for name, (peer, other) in sides.items():
            s = peer.session
            step = s.next_step()
            if isinstance(step, CheckPeer):
                peer.admit()
                s.peer_admitted()
                transcript.append((name, "check"))
                moved = True
            elif isinstance(step, Send):
                message = step.message if step.message is not None else peer.build(step.phase)
                body = b"".join(bytes(p) for p in s.send(message))
                wire[other] += encode_frame(body)
                transcript.append((name, step.phase.value))
                moved = True
            elif isinstance(step, Receive):
                # One byte at a time: the receiver sees frames only once they are whole.
                while wire[name] and not inbox[name]:
                    inbox[name] += decoders[name].feed(bytes(wire[name][:1]))
                    del wire[name][:1]
                if inbox[name]:
                    frame = inbox[name].pop(0)
                    assert len(frame) <= step.max_len
                    m = s.receive(frame)
                    if isinstance(m, msg.ManifestMessage):
                        peer.manifests.append(m)
                    elif isinstance(m, msg.Entry):
                        s.check_entry(*_origin_version(m))
                        peer.got.append(m)
                    moved = True
        if isinstance(a.session.next_step(), Done) and isinstance(b.session.next_step(), Done):
            assert not wire["a"]
            assert not wire["b"]
            return transcript
        assert moved, f"deadlock after {transcript}"
    raise AssertionError("no end")


def _origin_version(e: msg.Entry) -> tuple[str, int]:
    body = EntryBody.from_bytes(e.envelope.body)
    return body.origin, body.version


def test_full_session_follows_the_documented_turn_order() -> None:
    ea, eb = entry(ALICE, version=3), entry(BOB, version=5)
    a, b = Peer(session(True), held=[ea]), Peer(session(False, B, A), held=[eb])
    assert a.session.next_step() == Send(Phase.HELLO, a.session.hello)
    assert b.session.next_step() == Receive(Phase.HELLO, MAX_CONTROL_FRAME_LEN)
    transcript = run(a, b)
    assert transcript == [
        ("a", "hello"), ("b", "hello"), ("b", "check"), ("a", "check"),
        ("a", "digest"), ("b", "digest"),
        ("a", "want"), ("b", "want"),
        ("a", "announce"), ("a", "entry"), ("b", "announce"), ("b", "entry"),
    ]
    assert [m.envelope for m in a.got] == [eb.envelope]
    assert [m.envelope for m in b.got] == [ea.envelope]
    assert a.session.done
    assert b.session.done
    assert a.session.my_want.items == (_origin_version(eb),)
    assert b.session.their_want == a.session.my_want


def test_nothing_to_exchange_ends_after_two_empty_announcements() -> None:
    a, b = Peer(session(True)), Peer(session(False, B, A))
    assert run(a, b)[-2:] == [("a", "announce"), ("b", "announce")]


@pytest.mark.parametrize(("a_seq", "b_seq", "sender"), [(2, 1, "a"), (1, 2, "b"), (1, 1, None)])
def test_the_higher_manifest_is_pushed_after_hello_in_either_direction(
    a_seq: int, b_seq: int, sender: str | None
) -> None:
    a, b = Peer(session(True, seq=a_seq)), Peer(session(False, B, A, seq=b_seq))
    transcript = run(a, b)
    at = transcript.index
    # Its holder admits the peer under it first, sends it, then the receiver decides under
    # the manifest it just learned; on a tie both decide at once, nothing is pushed.
    if sender is None:
        assert {t for t in transcript if t[1] == "manifest"} == set()
    else:
        other = "b" if sender == "a" else "a"
        assert at((sender, "check")) < at((sender, "manifest")) < at((other, "check"))
    for name in "ab":  # and each decides before it sends anything beyond its Hello
        first = next(i for i, (n, what) in enumerate(transcript)
                     if n == name and what not in ("hello", "check"))
        assert at((name, "check")) < first
    receiver = {"a": b, "b": a, None: None}[sender]
    for p in (a, b):
        assert p.manifests == ([SIGNED[2]] if p is receiver else [])


def test_a_node_without_a_signed_manifest_never_sends_one_and_learns_it() -> None:
    a = Peer(session(True, held_manifest=False))
    b = Peer(session(False, B, A, seq=1))
    assert ("a", "manifest") not in run(a, b)
    assert a.manifests == [SIGNED[1]]


def test_membership_is_decided_after_the_manifest_and_before_any_digest() -> None:
    order: list[str] = []
    a = Peer(session(True, seq=1), admit=lambda: order.append(f"a checks, held {a.manifests}"))
    b = Peer(session(False, B, A, seq=2), admit=lambda: order.append("b checks"))
    run(a, b)
    # b decides under the manifest it holds, before a learns anything of the fleet from it.
    assert order == ["b checks", f"a checks, held {[SIGNED[2]]}"]


def hellos_done(s: Session, their_seq: int) -> None:
    """Both Hellos went by (the peer announcing ``their_seq``), in the session's order."""
    theirs = hello_frame(node=s.peer_id, seq=their_seq)
    if s.initiator:
        s.send(s.hello)
        s.receive(theirs)
    else:
        s.receive(theirs)
        s.send(s.hello)


@pytest.mark.parametrize("initiator", [True, False])
@pytest.mark.parametrize("their_seq", [0, 1])  # a placeholder manifest, or an older one
def test_the_holder_of_the_newer_manifest_sends_it_only_to_a_peer_its_node_admitted(
    initiator: bool, their_seq: int
) -> None:
    # The manifest lists every member's key; the fleet id, all a stranger needs to get
    # this far, is public (mDNS). Before the fix the manifest went out right after Hello.
    refusing = session(initiator, seq=2) if initiator else session(False, B, A, seq=2)
    hellos_done(refusing, their_seq)
    assert refusing.next_step() == CheckPeer()
    body = refusing.fail(ProtocolError(Reason.NOT_MEMBER, "stranger"))
    assert msg.decode_frame(b"".join(map(bytes, body))) == msg.Error("not_member", "stranger")
    with pytest.raises(SessionStateError):  # nothing of the fleet can follow the refusal
        refusing.next_step()
    # The same peer, admitted: now (and only now) the manifest goes out, then the Digests.
    admitting = session(initiator, seq=2) if initiator else session(False, B, A, seq=2)
    hellos_done(admitting, their_seq)
    assert admitting.next_step() == CheckPeer()
    admitting.peer_admitted()
    assert admitting.next_step() == Send(Phase.MANIFEST, SIGNED[2])
    admitting.send(SIGNED[2])
    expected = (Send(Phase.DIGEST) if initiator else
                Receive(Phase.DIGEST, MAX_CONTROL_FRAME_LEN))
    assert admitting.next_step() == expected


@pytest.mark.parametrize("initiator", [True, False])
def test_the_side_with_the_older_manifest_decides_only_once_it_received_the_newer(
    initiator: bool,
) -> None:
    # A newcomer admitted in seq 2 meets a node that holds seq 1: the node waits for the
    # manifest that may admit the newcomer before it decides.
    s = session(initiator, seq=1) if initiator else session(False, B, A, seq=1)
    hellos_done(s, 2)
    assert s.next_step() == Receive(Phase.MANIFEST, MAX_MANIFEST_FRAME_LEN)
    with pytest.raises(SessionStateError):
        s.peer_admitted()
    assert s.receive(SIGNED[2].head()) == SIGNED[2]
    assert s.next_step() == CheckPeer()


def test_a_refusal_instead_of_the_manifest_ends_the_session_of_the_refused_side() -> None:
    a = Peer(session(True, held_manifest=False))  # a stranger with no manifest: seq 0
    b = session(False, B, A, seq=1)
    hellos_done(b, 0)
    a.session.send(a.session.hello)
    a.session.receive(b.hello.head())
    assert a.session.next_step() == Receive(Phase.MANIFEST, MAX_MANIFEST_FRAME_LEN)
    assert b.next_step() == CheckPeer()
    err = refused(a.session, b"".join(map(bytes, b.fail(ProtocolError(Reason.NOT_MEMBER, "no")))))
    assert err.message == "peer refused: not_member no"
    assert a.manifests == []


def hello_frame(fleet: bytes = FLEET, node: str = B, seq: int = 1) -> bytes:
    return msg.Hello(fleet, node, seq, ()).head()


def test_responder_answers_hello_before_refusing_a_wrong_fleet() -> None:
    s = session(False, B, A)
    s.receive(hello_frame(OTHER_FLEET, A))
    assert s.next_step() == Send(Phase.HELLO, s.hello)  # the peer learns who we are first
    s.send(s.hello)
    with pytest.raises(ProtocolError) as exc:
        s.next_step()
    assert exc.value.reason is Reason.WRONG_FLEET
    with pytest.raises(SessionStateError):  # and the machine stays failed
        s.next_step()


def test_initiator_refuses_a_hello_naming_another_node_than_the_handshake() -> None:
    s = session(True)
    s.send(s.hello)
    s.receive(hello_frame(node=node_id_of(MALLORY)))
    with pytest.raises(ProtocolError) as exc:
        s.next_step()
    assert exc.value.reason is Reason.BAD_SIGNATURE


def after_hello(initiator: bool = False) -> Session:
    """A session whose Hellos went by (both at seq 1) and whose peer was admitted."""
    s = session(True) if initiator else session(False, B, A)
    theirs = hello_frame(node=s.peer_id)
    if initiator:
        s.send(s.hello)
        s.receive(theirs)
    else:
        s.receive(theirs)
        s.send(s.hello)
    assert isinstance(s.next_step(), CheckPeer)
    s.peer_admitted()
    return s


def refused(s: Session, frame: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as exc:
        s.receive(frame)
    with pytest.raises(SessionStateError):
        s.next_step()
    return exc.value


def test_out_of_order_message_is_malformed() -> None:
    err = refused(session(False, B, A), msg.Digest(()).head())
    assert err.reason is Reason.MALFORMED
    assert err.message == "expected hello, got digest"
    s = after_hello()
    err = refused(s, msg.Want(()).head())
    assert err.message == "expected digest, got want"


def test_a_frame_while_it_is_our_turn_is_refused() -> None:
    s = session(True)  # the initiator speaks first
    err = refused(s, hello_frame())
    assert err.reason is Reason.MALFORMED
    assert "not the peer's turn" in err.message


def test_an_error_frame_ends_the_session_with_the_peers_reason() -> None:
    err = refused(session(False, B, A), msg.Error("not_member", "who are you").head())
    assert err.message == "peer refused: not_member who are you"


def test_every_control_turn_is_held_to_the_control_frame_limit() -> None:
    s = after_hello()
    step = s.next_step()
    assert step == Receive(Phase.DIGEST, MAX_CONTROL_FRAME_LEN)
    big = entry(ALICE, arrays={"w": np.zeros(20_000, dtype=np.float32)})
    frame = b"".join(bytes(p) for p in big.to_wire_parts()[1:])
    assert MAX_CONTROL_FRAME_LEN < len(frame) < ENTRY_LIMIT  # fine in an entry's turn only
    assert refused(s, frame).reason is Reason.TOO_LARGE


def entries_turn(wanted: list[msg.Entry]) -> Session:
    """A responder that asked for ``wanted`` and now waits for the initiator's announcement."""
    s = after_hello()
    s.receive(msg.Digest(tuple(item(e) for e in wanted)).head())
    s.send(msg.Digest(()))
    s.receive(msg.Want(()).head())
    s.send(msg.Want(tuple(_origin_version(e) for e in wanted)))
    assert s.next_step() == Receive(Phase.ANNOUNCE, MAX_CONTROL_FRAME_LEN)
    return s


def entry_frame(e: msg.Entry) -> bytes:
    return b"".join(bytes(p) for p in e.to_wire_parts()[1:])


def test_entries_get_the_entry_limit_and_must_match_their_announcement() -> None:
    e1, e2 = entry(ALICE, version=1), entry(ALICE, version=2, scale=2.0)
    s = entries_turn([e1])
    s.receive(msg.Digest((item(e1),)).head())
    assert s.next_step() == Receive(Phase.ENTRY, ENTRY_LIMIT)
    got = s.receive(entry_frame(e2))  # the frame is well-formed; the verified body differs
    assert isinstance(got, msg.Entry)
    assert s.announced_entry == item(e1)
    with pytest.raises(ProtocolError) as exc:
        s.check_entry(*_origin_version(e2))
    assert exc.value.message == "entry differs from its announcement"


@pytest.mark.parametrize("twice", [False, True])
def test_an_announcement_beyond_what_we_wanted_is_malformed(twice: bool) -> None:
    e1, e2 = entry(ALICE, version=1), entry(BOB, version=1)
    s = entries_turn([e1])
    announce = (item(e1), item(e1)) if twice else (item(e1), item(e2))
    err = refused(s, msg.Digest(announce).head())
    assert err.message == "peer announced an entry we did not ask for"


def test_more_entries_than_announced_are_refused() -> None:
    e1 = entry(ALICE, version=1)
    s = entries_turn([e1])
    s.receive(msg.Digest((item(e1),)).head())
    s.receive(entry_frame(e1))
    s.check_entry(*_origin_version(e1))
    assert s.next_step() == Send(Phase.ANNOUNCE)  # our turn now, not another entry
    err = refused(s, entry_frame(e1))
    assert "entry frame while it is not the peer's turn" in err.message


def test_a_frame_after_the_end_is_refused() -> None:
    a, b = Peer(session(True), held=[entry(ALICE)]), Peer(session(False, B, A))
    run(a, b)
    assert refused(a.session, msg.Digest(()).head()).reason is Reason.MALFORMED


def test_an_error_frame_in_an_entry_turn() -> None:
    e1 = entry(ALICE, version=1)
    s = entries_turn([e1])
    s.receive(msg.Digest((item(e1),)).head())
    err = refused(s, msg.Error("too_large").head())
    assert err.message == "expected entry, got error"


def test_fail_answers_with_an_error_frame_and_ends_the_session() -> None:
    s = after_hello()
    body = b"".join(bytes(p) for p in s.fail(ProtocolError(Reason.NOT_MEMBER, "x" * 500)))
    assert msg.decode_frame(body) == msg.Error("not_member", "x" * 200)
    with pytest.raises(SessionStateError):
        s.next_step()


def test_local_misuse_is_a_session_state_error_not_a_refusal_of_the_peer() -> None:
    s = session(True)
    bad: list[Callable[[], Any]] = [
        lambda: s.send(msg.Digest(())),  # wrong message for the turn
        lambda: s.send(msg.Hello(FLEET, A, 7, ())),  # not the Hello the session holds
        s.peer_admitted,  # nothing to decide yet
        lambda: s.check_entry(A, 1),  # no entry received
    ]
    for call in bad:
        with pytest.raises(SessionStateError):
            call()
    responder = after_hello()
    with pytest.raises(SessionStateError):  # the initiator's Digest comes first
        responder.send(msg.Digest(()))


def test_we_cannot_announce_what_the_peer_did_not_ask_for() -> None:
    s = after_hello(initiator=True)
    s.send(msg.Digest(()))
    s.receive(msg.Digest(()).head())
    s.send(msg.Want(()))
    s.receive(msg.Want(()).head())
    with pytest.raises(SessionStateError):
        s.send(msg.Digest((item(entry(ALICE)),)))


@pytest.mark.parametrize(("seq", "limit", "why"), [
    (0, 0, "entry_frame_limit 0 out of range"),
    (0, 2**31 + 1, f"entry_frame_limit {2**31 + 1} out of range"),
    (1, ENTRY_LIMIT, "without a signed manifest our Hello must announce seq 0"),  # none held
])
def test_inconsistent_inputs_are_refused(seq: int, limit: int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Session(initiator=True, hello=msg.Hello(FLEET, A, seq, ()), peer_id=B, manifest=None,
                entry_frame_limit=limit)
