"""resume/v1 on the wire: a Want item's offset and a resumed Entry's ``offset``, and the
session's rules for them (only between peers that both announce it; an entry's offset only
as asked)."""

from __future__ import annotations

import pytest

from peerd.core.reasons import Reason
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.session import CheckPeer, Receive, Send, Session, SessionStateError
from peerd.protocol.wire import pack
from tests.protocol.helpers import FLEET, entry
from tests.protocol.test_session import ENTRY_LIMIT, SIGNED, A, B, item

RESUME = msg.RESUME_CAPABILITY
E = entry()


def test_want_offsets_round_trip_and_stay_off_the_wire_when_zero() -> None:
    want = msg.Want(((A, 3), (B, 9)), (0, 4096))
    back = msg.decode_frame(want.head())
    assert back == want
    assert back.offset_of(B, 9) == 4096
    assert back.offset_of(A, 3) == 0
    plain = msg.Want(((A, 3),), (0,))
    assert msg.decode_frame(plain.head()) == msg.Want(((A, 3),))  # no offsets at all
    assert b"\x93" not in plain.head()  # every item a 2-array: what a v1 peer reads


@pytest.mark.parametrize("items", [[[A, 3, 0]], [[A, 3, -1]], [[A, 3, 1, 2]], [[A]]])
def test_a_bad_want_item_is_refused(items: list[list[object]]) -> None:
    frame = pack({"type": "want", "v": 1, "items": items})
    with pytest.raises(ProtocolError) as err:
        msg.decode_frame(frame)
    assert err.value.reason in (Reason.MALFORMED, Reason.TOO_LARGE)


def test_a_resumed_entry_carries_its_offset_and_only_the_rest() -> None:
    tail = msg.Entry(E.envelope, memoryview(E.payload)[8:], 8)
    back = msg.decode_frame(b"".join(bytes(p) for p in tail.to_wire_parts()[1:]))
    assert isinstance(back, msg.Entry)
    assert back.offset == 8
    assert bytes(back.payload) == bytes(E.payload)[8:]
    zero = pack({"type": "entry", "v": 1, "envelope": E.envelope.to_wire(), "offset": 0})
    with pytest.raises(ProtocolError, match="offset"):
        msg.decode_frame(zero)


def responder(caps: tuple[str, ...], their_caps: tuple[str, ...]) -> Session:
    """A responder session driven up to the peer's Want."""
    s = Session(initiator=False, hello=msg.Hello(FLEET, A, 1, caps), peer_id=B,
                manifest=SIGNED[1], entry_frame_limit=ENTRY_LIMIT)
    s.receive(msg.Hello(FLEET, B, 1, their_caps).head())
    s.send(s.next_step().message)  # type: ignore[union-attr,arg-type]
    assert isinstance(s.next_step(), CheckPeer)
    s.peer_admitted()
    s.receive(msg.Digest(()).head())
    s.send(msg.Digest((item(E),)))
    return s


def test_want_offsets_only_between_peers_that_both_resume() -> None:
    want = msg.Want(((A, 1),), (8,))
    s = responder((RESUME,), ())
    with pytest.raises(ProtocolError, match="resume"):
        s.receive(want.head())
    s = responder((RESUME,), (RESUME,))
    s.receive(want.head())
    assert s.their_want.offset_of(A, 1) == 8


def test_we_never_send_offsets_to_a_peer_that_does_not_resume() -> None:
    s = responder((), (RESUME,))
    s.receive(msg.Want(()).head())
    with pytest.raises(SessionStateError):
        s.send(msg.Want(((B, 1),), (8,)))


def test_an_entry_is_sent_from_exactly_the_offset_asked_for() -> None:
    s = responder((RESUME,), (RESUME,))
    s.receive(msg.Want(((A, 1),), (8,)).head())
    s.send(msg.Want(()))
    assert isinstance(s.next_step(), Receive)
    s.receive(msg.Digest(()).head())  # the initiator announces nothing
    s.send(msg.Digest((item(E),)))
    assert isinstance(s.next_step(), Send)
    with pytest.raises(SessionStateError):
        s.send(msg.Entry(E.envelope, memoryview(E.payload)[4:], 4))
    s.send(msg.Entry(E.envelope, memoryview(E.payload)[8:], 8))  # or the whole entry (0)


def initiator_wanting(offsets: tuple[int, ...]) -> Session:
    """An initiator that asked for the responder's entry E with ``offsets``."""
    s = Session(initiator=True, hello=msg.Hello(FLEET, B, 1, (RESUME,)), peer_id=A,
                manifest=SIGNED[1], entry_frame_limit=ENTRY_LIMIT)
    s.send(s.next_step().message)  # type: ignore[union-attr,arg-type]
    s.receive(msg.Hello(FLEET, A, 1, (RESUME,)).head())
    assert isinstance(s.next_step(), CheckPeer)
    s.peer_admitted()
    s.send(msg.Digest(()))
    s.receive(msg.Digest((item(E),)).head())
    s.send(msg.Want(((A, 1),), offsets))
    s.receive(msg.Want(()).head())
    s.send(msg.Digest(()))
    s.receive(msg.Digest((item(E),)).head())
    return s


@pytest.mark.parametrize(("asked", "sent", "ok"), [
    ((8,), 8, True), ((8,), 0, True), ((8,), 4, False), ((), 8, False)])
def test_a_received_entry_offset_must_be_the_one_we_asked_for(
        asked: tuple[int, ...], sent: int, ok: bool) -> None:
    s = initiator_wanting(asked)
    frame = msg.Entry(E.envelope, memoryview(E.payload)[sent:], sent)
    body = b"".join(bytes(p) for p in frame.to_wire_parts()[1:])
    if ok:
        got = s.receive(body)
        assert isinstance(got, msg.Entry)
        assert got.offset == sent
    else:
        with pytest.raises(ProtocolError, match="offset"):
            s.receive(body)
