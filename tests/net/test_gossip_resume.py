"""A cut entry transfer resumes where it stopped (resume/v1): only the rest crosses the link,
the whole entry is verified as any other, a kept prefix that does not fit is refused and
dropped, and a peer without the capability gets the session it always had."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from peerd.net.framing import AfterPart, FrameSink, StreamClosedError
from peerd.net.gossip import SessionContext, SessionResult, run_session
from peerd.node.state import NodeState
from peerd.protocol import messages as msg
from peerd.protocol.entry import EntryBody
from peerd.store.partials import Partials
from peerd.store.statefile import HEADER_LEN
from tests.net.test_gossip import CTX, A, B, MemoryIO, pipe, publish, signed_node


class CuttingIO(MemoryIO):
    """Receives the first entry frame only up to ``cut_at`` body bytes, then the link dies."""

    def __init__(self, io: MemoryIO, cut_at: int | None) -> None:
        super().__init__(io._send, io._recv)
        self.cut_at = cut_at
        self.entry_bytes: list[int] = []  # body bytes of each entry frame received

    async def recv(self, max_len: int, sink: FrameSink | None = None) -> bytes | memoryview:
        if sink is None:
            return await super().recv(max_len, sink)
        frame = await self._recv.receive()
        self.entry_bytes.append(len(frame))
        sink.begin(len(frame))
        if self.cut_at is not None:
            sink.write(frame[: self.cut_at])
            sink.abort()  # as peerd.net.framing does when the stream ends mid-frame
            raise StreamClosedError("cut")
        sink.write(frame)
        return sink.finish()


class CountingIO(MemoryIO):
    def __init__(self, io: MemoryIO) -> None:
        super().__init__(io._send, io._recv)
        self.sent: list[int] = []

    async def send(self, parts: Sequence[bytes | memoryview],
                   after_part: AfterPart | None = None) -> None:
        self.sent.append(sum(len(p) for p in parts))
        await super().send(parts, after_part)


def run(sender: NodeState, receiver: NodeState, s_ctx: SessionContext, r_ctx: SessionContext,
        cut_at: int | None = None) -> tuple[SessionResult | None, CountingIO, CuttingIO]:
    """One session, ``sender`` dialling; the receiver's link is cut inside the first entry
    frame when ``cut_at`` is given (both sides then stop)."""
    io_s, io_r = pipe()
    s_io, r_io = CountingIO(io_s), CuttingIO(io_r, cut_at)
    out: dict[str, SessionResult] = {}

    async def main() -> None:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                async def side(name: str, io: MemoryIO, n: NodeState, peer: str, init: bool,
                               ctx: SessionContext) -> None:
                    try:
                        out[name] = await run_session(io, n, ctx, peer_id=peer, initiator=init)
                    except StreamClosedError:
                        nursery.cancel_scope.cancel()  # the link is gone for both

                nursery.start_soon(side, "s", s_io, sender, receiver.id, True, s_ctx)
                nursery.start_soon(side, "r", r_io, receiver, sender.id, False, r_ctx)

    trio.run(main)
    return out.get("r"), s_io, r_io


def resuming(directory: Path, partials: Partials) -> SessionContext:
    directory.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(CTX, spool_dir=directory, partials=partials)


def both_resume(tmp_path: Path, partials: Partials) -> tuple[SessionContext, SessionContext]:
    """The sender's context and the receiver's (holding ``partials``), both on resume/v1."""
    return resuming(tmp_path / "a", Partials(min_bytes=1)), resuming(tmp_path / "b", partials)


def entry_frame_len(n: NodeState) -> int:
    assert n.own is not None
    return len(n.own.message.head()) + len(n.own.message.payload)


@pytest.fixture
def pair() -> tuple[NodeState, NodeState]:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    publish(a, 3)
    return a, b


def test_a_cut_transfer_resumes_with_only_the_rest(tmp_path: Path,
                                                   pair: tuple[NodeState, NodeState]) -> None:
    a, b = pair
    partials = Partials(min_bytes=1)
    a_ctx, b_ctx = both_resume(tmp_path, partials)
    assert a.own is not None
    head = len(a.own.message.head())
    payload = len(a.own.message.payload)
    cut = head + payload // 2
    result, _, r_io = run(a, b, a_ctx, b_ctx, cut_at=cut)
    assert result is None  # the session died with the link
    assert b.cache == []
    assert len(partials) == 1  # what arrived is kept, nothing else
    [kept] = (tmp_path / "b").iterdir()
    assert kept.stat().st_size == HEADER_LEN + cut
    # The next session asks for the rest and gets only the rest.
    result, _, r_io = run(a, b, a_ctx, b_ctx)
    assert result is not None
    assert result.received == 1
    [tail_frame] = r_io.entry_bytes
    assert tail_frame < entry_frame_len(a)
    assert tail_frame == len(msg.Entry(a.own.message.envelope, b"", payload // 2).head()) + (
        payload - payload // 2)
    [item] = b.cache
    assert (item.meta.origin, item.meta.version, item.meta.digest) == (
        a.id, 3, a.own.entry.meta.digest)
    assert item.verified
    assert (partials.resumed, partials.bytes_saved, len(partials)) == (1, payload // 2, 0)


def test_a_kept_prefix_that_does_not_fit_is_refused_and_dropped(
        tmp_path: Path, pair: tuple[NodeState, NodeState]) -> None:
    a, b = pair
    partials = Partials(min_bytes=1)
    a_ctx, b_ctx = both_resume(tmp_path, partials)
    assert a.own is not None
    head = len(a.own.message.head())
    run(a, b, a_ctx, b_ctx, cut_at=head + 40)
    [kept] = (tmp_path / "b").iterdir()
    data = bytearray(kept.read_bytes())
    data[HEADER_LEN + head + 3] ^= 0xFF  # a payload byte of the kept prefix, flipped
    kept.write_bytes(bytes(data))
    result, _, _ = run(a, b, a_ctx, b_ctx)
    assert result is not None
    assert result.received == 0
    assert sum(result.refused.values()) == 1  # the whole entry did not match its signature
    assert b.cache == []
    assert len(partials) == 0
    gc.collect()
    assert list((tmp_path / "b").iterdir()) == []  # nothing left behind
    result, _, r_io = run(a, b, a_ctx, b_ctx)  # fetched whole next time
    assert result is not None
    assert result.received == 1
    assert r_io.entry_bytes == [entry_frame_len(a)]


def test_a_peer_without_the_capability_sends_the_whole_entry(
        tmp_path: Path, pair: tuple[NodeState, NodeState]) -> None:
    a, b = pair
    partials = Partials(min_bytes=1)
    b_ctx = resuming(tmp_path / "b", partials)
    assert a.own is not None
    run(a, b, resuming(tmp_path / "a", Partials(min_bytes=1)), b_ctx,
        cut_at=len(a.own.message.head()) + 40)
    assert len(partials) == 1
    old = dataclasses.replace(CTX, spool_dir=tmp_path / "a")  # a release without resume/v1
    result, _, r_io = run(a, b, old, b_ctx)
    assert result is not None
    assert result.received == 1
    assert r_io.entry_bytes == [entry_frame_len(a)]
    assert partials.resumed == 0


def test_a_cut_without_a_whole_entry_head_keeps_nothing(
        tmp_path: Path, pair: tuple[NodeState, NodeState]) -> None:
    a, b = pair
    partials = Partials(min_bytes=1)
    assert a.own is not None
    run(a, b, resuming(tmp_path / "a", Partials()), resuming(tmp_path / "b", partials),
        cut_at=len(a.own.message.head()) // 2)
    assert len(partials) == 0
    gc.collect()
    assert list((tmp_path / "b").iterdir()) == []


def test_the_kept_head_names_the_entry_it_was_cut_from(
        tmp_path: Path, pair: tuple[NodeState, NodeState]) -> None:
    a, b = pair
    partials = Partials(min_bytes=1)
    assert a.own is not None
    head = len(a.own.message.head())
    run(a, b, resuming(tmp_path / "a", Partials()), resuming(tmp_path / "b", partials),
        cut_at=head + 10)
    body = EntryBody.from_bytes(bytes(a.own.message.envelope.body))
    offered = msg.Digest((msg.DigestItem(a.id, 3, body.created_at, bytes.fromhex(body.digest)),))
    want = partials.resume(1, msg.Want(((a.id, 3),)), offered)
    assert want.offsets == (10,)
    # Claimed: a second session at the same time fetches it whole.
    assert partials.resume(2, msg.Want(((a.id, 3),)), offered).offsets == ()
    partials.release(1)
    assert partials.resume(2, msg.Want(((a.id, 3),)), offered).offsets == (10,)
    # Another payload under the same (origin, version): not resumed.
    other = msg.Digest((dataclasses.replace(offered.entries[0], digest=bytes(32)),))
    partials.release(2)
    assert partials.resume(3, msg.Want(((a.id, 3),)), other).offsets == ()
