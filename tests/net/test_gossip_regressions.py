"""Regressions found by the multi-host scenarios (tests/integration/test_scenarios.py)."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from peerd.net.framing import AfterPart, FrameSink, FrameTooLargeError
from peerd.net.gossip import SessionResult, run_session
from peerd.protocol import messages as msg
from tests.net.test_gossip import CTX, A, B, MemoryIO, pipe, publish, signed_node


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
