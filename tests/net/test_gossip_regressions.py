"""Regressions found by the multi-host scenarios (tests/integration/test_scenarios.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import pytest
import trio
import trio.testing
from trio.testing import MockClock, memory_stream_pair

from peerd.net.framing import (
    RECEIVE_GRACE_S,
    AfterPart,
    FrameSink,
    FrameTooLargeError,
    TransportError,
    TrioFramedStream,
)
from peerd.net.gossip import ReceiveSlots, SessionResult, run_session
from peerd.net.transport_config import MAX_INBOUND_STREAMS_PER_PEER
from peerd.node.state import NodeState
from peerd.protocol import messages as msg
from peerd.protocol.frames import frame_header
from tests.net.test_gossip import CTX, A, B, C, MemoryIO, pipe, publish, signed_node


class WantHookIO(MemoryIO):
    """Calls ``hook`` right after this side has sent its Want frame."""

    def __init__(self, inner: MemoryIO, hook: object) -> None:
        super().__init__(inner._send, inner._recv)
        self.hook = hook

    async def send(self, parts: Sequence[bytes | memoryview],
                   after_part: AfterPart | None = None) -> None:
        await super().send(parts, after_part)
        if isinstance(msg.decode_frame(b"".join(bytes(p) for p in parts)), msg.Want):
            self.hook()  # type: ignore[operator]


def test_cache_moving_after_the_want_does_not_make_an_honest_peer_malformed() -> None:
    # a asks b for b@5; before b's entry arrives, another session gives a that very entry
    # (here: its ledger records it). b sends what it was asked for: that is no protocol
    # violation, just an entry a no longer needs (benign not_newer), and the session is fine.
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    publish(b, 5)
    assert b.own is not None
    digest = b.own.entry.meta.digest
    results: dict[str, SessionResult] = {}

    async def main() -> None:
        io_a, io_b = pipe()
        hooked = WantHookIO(io_a, lambda: a.ledger.record(b.id, 5, digest))

        async def side(name: str, io: MemoryIO, n: object, peer: str, init: bool) -> None:
            results[name] = await run_session(io, n, CTX, peer_id=peer,  # type: ignore[arg-type]
                                              initiator=init)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(side, "a", hooked, a, b.id, True)
                nursery.start_soon(side, "b", io_b, b, a.id, False)

    trio.run(main)
    assert results["a"].refused == {"not_newer": 1}
    assert "malformed" not in a.rejected
    assert a.dropped["not_newer"] == 1
    assert results["b"].refused == {}
    assert results["b"].sent == 1


class OversizeIO:
    """A peer whose first frame header announces more than the limit."""

    def __init__(self) -> None:
        self.reset_called = False
        self.sent: list[bytes] = []

    async def send(self, parts: Sequence[bytes | memoryview],
                   after_part: AfterPart | None = None) -> None:
        self.sent.append(b"".join(bytes(p) for p in parts))

    async def recv(self, max_len: int, sink: FrameSink | None = None) -> bytes:
        raise FrameTooLargeError(2**31, max_len)

    async def reset(self) -> None:
        self.reset_called = True


def test_an_oversize_frame_is_counted_as_too_large_and_the_stream_reset() -> None:
    b = signed_node(B, 1, A, B)
    io = OversizeIO()
    result = trio.run(lambda: run_session(io, b, CTX, peer_id=signed_node(A, 1, A, B).id,
                                          initiator=False))
    assert result.refused == {"too_large": 1}
    assert b.rejected["too_large"] == 1
    assert io.reset_called
    assert io.sent == []  # desynchronised: no Error frame, no Hello


# --- issue 12, item 16: one member trickling entries must not stall the receive slots -----

#: A trickler sends one byte of its entry this often: far below any sensible floor.
TRICKLE_EVERY_S = 1.0


class TricklingIO(TrioFramedStream):
    """An honest session, except that entry frames are trickled: the header and a few bytes,
    then one byte every TRICKLE_EVERY_S, with no deadline of its own, until we cut it."""

    async def send(self, parts: Sequence[bytes | bytearray | memoryview],
                   after_part: AfterPart | None = None) -> None:
        body = b"".join(bytes(p) for p in parts)
        if not isinstance(msg.decode_frame(body), msg.Entry):
            await super().send(parts, after_part)
            return
        data = frame_header(len(body)) + body
        await self.write(data[:16])
        for i in range(16, len(data)):
            await trio.sleep(TRICKLE_EVERY_S)
            await self.write(data[i:i + 1])


def test_a_member_trickling_entries_on_8_streams_does_not_stall_another_members_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: a trickled entry held the only receive slot until its frame deadline (30 s +
    # len / 256 KiB/s, here ~30 s), and the member's 8 streams queued ahead of the honest
    # member one after another: its entry landed after ~240 s. Now each stream is cut when
    # it falls below MIN_RECEIVE_RATE_BPS after RECEIVE_GRACE_S (too_slow), and the
    # member's streams take one turn, not 8: the honest entry lands after one grace period.
    m, t, h = signed_node(A, 1, A, B, C), signed_node(B, 1, A, B, C), signed_node(C, 1, A, B, C)
    publish(t, 5)
    publish(h, 7)
    ctx = dataclasses.replace(CTX, receive_slots=ReceiveSlots(1))
    # Verification inline: no worker thread, so the mock clock only moves when all is idle.
    monkeypatch.setattr(trio.to_thread, "run_sync", _inline)
    t_results: list[SessionResult] = []
    h_landed: list[float] = []

    async def receive(stream: trio.abc.Stream, peer: str, out: list[SessionResult]) -> None:
        try:
            out.append(await run_session(TrioFramedStream(stream, peer), m, ctx, peer_id=peer,
                                         initiator=False))
        except (TransportError, trio.BrokenResourceError):
            pass  # before the fix: the frame deadline ended it, or the peer had given up
        finally:
            await stream.aclose()

    async def send(stream: trio.abc.Stream, io: TrioFramedStream, n: NodeState) -> None:
        with contextlib.suppress(TransportError, trio.BrokenResourceError,
                                 trio.ClosedResourceError):
            await run_session(io, n, CTX, peer_id=m.id, initiator=True)
        await stream.aclose()

    async def honest() -> None:
        ours, theirs = memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, theirs, TrioFramedStream(theirs, m.id), h)
            await receive(ours, h.id, [])
        h_landed.append(trio.current_time())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(MAX_INBOUND_STREAMS_PER_PEER):
                ours, theirs = memory_stream_pair()
                nursery.start_soon(receive, ours, t.id, t_results)
                nursery.start_soon(send, theirs, TricklingIO(theirs, m.id), t)
            await trio.testing.wait_all_tasks_blocked()  # all 8 hold or wait for the slot
            nursery.start_soon(honest)

    clock = MockClock(autojump_threshold=0)  # virtual time from 0: the test takes none
    trio.run(main, clock=clock)
    assert h_landed[0] <= RECEIVE_GRACE_S + 1  # was ~8 x 30 s
    assert [(e.meta.origin, e.meta.version) for e in m.cache] == [(h.id, 7)]
    assert [r.refused for r in t_results] == [{"too_slow": 1}] * MAX_INBOUND_STREAMS_PER_PEER
    assert m.rejected["too_slow"] == MAX_INBOUND_STREAMS_PER_PEER


async def _inline(fn: Callable[[], object], *args: object, **kwargs: object) -> object:
    return fn()
