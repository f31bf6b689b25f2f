"""The wire of the gossip-scale simulator (:mod:`peerd.sim.gossipsim`): in-memory framed
links with a one-way latency and an optional cut, and the two adjustments that make trio
deterministic under a simulated clock.

A :class:`Link` joins two :class:`LinkEnd`\\ s, each a :class:`peerd.net.gossip.FrameIO`
(what the libp2p stream is to the daemon): a frame sent at simulated time t is readable at
t + latency, in order. A lost session is a link cut after a chosen number of frames, or
when either node leaves (churn): both ends then raise :class:`LinkCutError` (the transport
error a torn stream gives the daemon). Bytes are counted per frame with the 4-byte length
prefix; Noise and Yamux framing are not modelled.

It owns no node state and makes no gossip decision; it must not import the daemon or the
transport.
"""

from __future__ import annotations

import importlib
import math
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from unittest import mock

import trio

from peerd.core.reasons import Reason
from peerd.net.framing import AfterPart, FrameSink
from peerd.protocol import identity
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import FRAME_HEADER_LEN


class LinkCutError(Exception):
    """The simulated stream broke (a lost session, or a node that left)."""


Frame = tuple[float, bytes]  # (readable at, frame body)


class Link:
    """One session's stream between two nodes."""

    def __init__(self, latency_s: float, cut_after: int | None,
                 alive: Callable[[], bool], on_bytes: Callable[[int, int], None]) -> None:
        self.latency_s = latency_s
        #: Frames still allowed through before the link breaks; None: it never breaks itself.
        self.cut_after = cut_after
        self.broken = False
        self._alive = alive  # both nodes still up
        self._on_bytes = on_bytes  # (side, bytes): the sender's count
        pairs = [trio.open_memory_channel[Frame](math.inf) for _ in range(2)]
        # End 0 sends on pair 0 and reads pair 1; end 1 the other way round.
        self.ends = (LinkEnd(self, 0, pairs[0][0], pairs[1][1]),
                     LinkEnd(self, 1, pairs[1][0], pairs[0][1]))
        self._senders = (pairs[0][0], pairs[1][0])

    def cut(self) -> None:
        """Break the stream: both ends raise :class:`LinkCutError` from now on."""
        self.broken = True
        for sender in self._senders:
            sender.close()  # a reader waiting for a frame wakes up (EndOfChannel)

    def finish(self, side: int) -> None:
        """``side`` ended its session: the peer reads what is queued, then end of stream."""
        self._senders[side].close()

    def _admit_frame(self) -> None:
        if self.broken or not self._alive():
            self.cut()
            raise LinkCutError("stream broken")
        if self.cut_after is not None:
            if self.cut_after <= 0:
                self.cut()
                raise LinkCutError("session lost")
            self.cut_after -= 1


class LinkEnd:
    """One side of a :class:`Link`: a ``FrameIO`` for :func:`peerd.net.gossip.run_session`."""

    def __init__(self, link: Link, side: int, send: trio.MemorySendChannel[Frame],
                 recv: trio.MemoryReceiveChannel[Frame]) -> None:
        self._link, self._side, self._send, self._recv = link, side, send, recv

    async def send(self, parts: Sequence[bytes | memoryview],
                   after_part: AfterPart | None = None) -> None:
        self._link._admit_frame()
        frame = b"".join(bytes(p) for p in parts)
        if after_part is not None:
            for i in range(len(parts)):
                after_part(i)
        self._link._on_bytes(self._side, len(frame) + FRAME_HEADER_LEN)
        try:
            self._send.send_nowait((trio.current_time() + self._link.latency_s, frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise LinkCutError("stream broken") from None
        await trio.lowlevel.checkpoint()

    async def recv(self, max_len: int, sink: FrameSink | None = None) -> bytes | memoryview:
        try:
            readable_at, frame = await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise LinkCutError("stream ended") from None
        if readable_at > trio.current_time():
            await trio.sleep_until(readable_at)
        if self._link.broken:
            raise LinkCutError("stream broken")
        if len(frame) > max_len:  # as peerd.net.framing: checked before the body is kept
            raise ProtocolError(Reason.TOO_LARGE, f"frame of {len(frame)} B over {max_len}")
        if sink is None:
            return frame
        sink.begin(len(frame))
        sink.write(frame)
        return sink.finish()


async def _inline(fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
    """``trio.to_thread.run_sync`` in the simulator: run at once on the loop thread.

    The daemon verifies entries in a worker thread; a thread's run time is invisible to a
    mock clock that jumps whenever every task waits, so the clock would move by wall-clock
    accident. Verification of a few-byte entry takes microseconds, so inline it is."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


def _memoized(fn: Callable[[str], bytes]) -> Callable[[str], bytes]:
    known: dict[str, bytes] = {}

    def lookup(node_id: str) -> bytes:
        if type(node_id) is str and node_id in known:
            return known[node_id]
        key = known[node_id] = fn(node_id)  # raises for a malformed id: nothing kept
        return key

    return lookup


@contextmanager
def sim_runtime(seed: int) -> Iterator[None]:
    """Worker threads inlined, node ids checked once each, and trio's scheduler seeded.

    Every node id in a Digest, Want or Hello is decoded from base58 and encoded back (to
    reject non-canonical spellings): ~0.1 ms per id, two thirds of a simulated session's
    cost, spent a hundred times a second by a simulated fleet and a few times per sweep by
    a daemon. The simulator remembers the ids that passed (a fleet has N of them); an id
    that fails is checked again every time, as before.

    trio reverses a batch of runnable tasks at random (an unseeded ``random.Random`` in
    ``trio._core._run``, there to shake out order assumptions); seeding it is what makes two
    runs with one seed identical. It is private to trio: without it, runs are still valid
    simulations, only not repeatable."""
    scheduler = getattr(importlib.import_module("trio._core._run"), "_r", None)
    saved = scheduler.getstate() if isinstance(scheduler, random.Random) else None
    if isinstance(scheduler, random.Random):
        scheduler.seed(seed)
    try:
        with mock.patch.object(trio.to_thread, "run_sync", _inline), mock.patch.object(
                identity, "public_key_from_node_id", _memoized(identity.public_key_from_node_id)):
            yield
    finally:
        if isinstance(scheduler, random.Random) and saved is not None:
            scheduler.setstate(saved)
