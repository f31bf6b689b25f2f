"""Gossip sessions between two nodes over an in-memory framed stream."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from pathlib import Path

import trio

from peerd.core.reasons import Reason
from peerd.net.framing import AfterPart, FrameSink
from peerd.net.gossip import SessionContext, SessionResult, run_session
from peerd.node.entryfile import EntryFile
from peerd.node.state import Held, NodeState, sign_own
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import private_key_from_seed, public_key_bytes
from peerd.protocol.manifest import Manifest
from peerd.store import persist
from peerd.store.statedir import CACHE_INDEX_BLOB, ENTRY_BLOB_PREFIX, StateDir
from tests.node.fleet import FLEET, NOW, key, manifest, model, node

ADMIN = private_key_from_seed(b"\xaa" * 32)
A, B, C, OUT = key(1), key(2), key(3), key(9)


class MemoryIO:
    def __init__(self, send: trio.MemorySendChannel[bytes],
                 recv: trio.MemoryReceiveChannel[bytes]) -> None:
        self._send, self._recv = send, recv
        self.frames_sent = 0

    async def send(self, parts: Sequence[bytes | memoryview],
                   after_part: AfterPart | None = None) -> None:
        self.frames_sent += 1
        joined = b""
        for i, part in enumerate(parts):
            joined += bytes(part)
            if after_part is not None:
                after_part(i)
        await self._send.send(joined)

    async def recv(self, max_len: int, sink: FrameSink | None = None) -> bytes | memoryview:
        frame = await self._recv.receive()
        if len(frame) > max_len:
            raise ProtocolError(Reason.TOO_LARGE, "frame over the limit")
        if sink is None:
            return frame
        sink.begin(len(frame))  # as peerd.net.framing does: the body goes to the sink
        sink.write(frame)
        return sink.finish()


def pipe() -> tuple[MemoryIO, MemoryIO]:
    a_send, b_recv = trio.open_memory_channel[bytes](1000)
    b_send, a_recv = trio.open_memory_channel[bytes](1000)
    return MemoryIO(a_send, a_recv), MemoryIO(b_send, b_recv)


def signed_node(k: object, seq: int, *members: object) -> NodeState:
    man = manifest(*members, seq=seq)  # type: ignore[arg-type]
    n = node(k, man)  # type: ignore[arg-type]
    n.manifest_envelope = man.sign(ADMIN)
    return n


def publish(n: NodeState, version: int, at: float = NOW) -> None:
    entry, message = sign_own(n.key, FLEET, params=model(version), version=version,
                              created_at=at, num_examples=10)
    n.set_own(entry, message)


CTX = SessionContext(admin_key=public_key_bytes(ADMIN), now=lambda: NOW)


def session(a: NodeState, b: NodeState, *, a_claims: str | None = None,
            b_claims: str | None = None, a_ctx: SessionContext = CTX,
            b_ctx: SessionContext = CTX) -> tuple[SessionResult, SessionResult]:
    results: dict[str, SessionResult] = {}

    async def main() -> None:
        io_a, io_b = pipe()

        async def side(name: str, io: MemoryIO, n: NodeState, peer: str, init: bool,
                       ctx: SessionContext) -> None:
            results[name] = await run_session(io, n, ctx, peer_id=peer, initiator=init)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(side, "a", io_a, a, b_claims or b.id, True, a_ctx)
                nursery.start_soon(side, "b", io_b, b, a_claims or a.id, False, b_ctx)

    trio.run(main)
    return results["a"], results["b"]


def test_two_members_swap_their_entries_both_ways() -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    publish(a, 3)
    publish(b, 5)
    ra, rb = session(a, b)
    assert (ra.sent, ra.received, rb.sent, rb.received) == (1, 1, 1, 1)
    assert [(i.meta.origin, i.meta.version) for i in a.cache] == [(b.id, 5)]
    assert [(i.meta.origin, i.meta.version) for i in b.cache] == [(a.id, 3)]
    # a second session moves nothing
    ra, rb = session(b, a)
    assert ra.sent == ra.received == rb.sent == rb.received == 0
    assert a.accepted == b.accepted == 1  # the status' and the metrics' counter


def _committed(frame: EntryFile) -> bool:
    """Read through a call: mypy keeps an attribute narrowed across the persist in between."""
    return frame.committed


def spool_ctx(directory: Path) -> SessionContext:
    directory.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(CTX, spool_dir=directory)


def test_entries_spooled_to_disk_are_relayed_intact_and_committed_by_persist(
    tmp_path: Path,
) -> None:
    a, b, c = (signed_node(k, 1, A, B, C) for k in (A, B, C))
    publish(a, 4)
    state = StateDir(tmp_path / "b")
    _, rb = session(a, b, b_ctx=spool_ctx(state.blobs))
    assert rb.received == 1
    held = b.cache[0].payload
    assert isinstance(held, Held)
    assert held.frame is not None
    assert not held.frame.committed
    assert a.own is not None
    assert bytes(held.message.payload) == bytes(a.own.message.payload)
    # b relays it from its mapped file; c (in memory) verifies the origin's signature.
    session(b, c)
    assert [(i.meta.origin, i.meta.version, i.received_from) for i in c.cache] == [
        (a.id, 4, b.id)]
    # Persisting renames the spooled file into place: nothing is written twice, no temp left.
    persist.save_cache(state, b, set())
    assert _committed(held.frame)
    assert sorted(p.name for p in state.blobs.iterdir()) == [
        CACHE_INDEX_BLOB, f"{ENTRY_BLOB_PREFIX}{a.id}"]
    # Saving again, even with a stale record of what is on disk, never rewrites a mapped
    # entry (that read the whole entry back into memory): same file, same inode.
    stored = state.blob_path(f"{ENTRY_BLOB_PREFIX}{a.id}")
    inode = stored.stat().st_ino
    persist.save_cache(state, b, set())
    assert stored.stat().st_ino == inode
    fresh = signed_node(B, 1, A, B, C)
    assert persist.restore(StateDir(tmp_path / "b"), fresh, now=NOW).cached == 1
    restored = fresh.cache[0].payload
    assert isinstance(restored, Held)
    assert restored.frame is not None
    assert bytes(restored.message.payload) == bytes(a.own.message.payload)


def test_a_refused_spooled_entry_leaves_nothing_in_the_state_directory(tmp_path: Path) -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    publish(a, 2)
    assert a.own is not None
    payload = bytearray(a.own.message.payload)
    payload[0] ^= 0x01  # one flipped bit: the signed SHA-256 no longer matches
    a.own = Held(a.own.entry, msg.Entry(a.own.message.envelope, bytes(payload)))
    _, rb = session(a, b, b_ctx=spool_ctx(tmp_path / "spool"))
    assert rb.refused == {"payload_mismatch": 1}
    assert b.cache == []
    gc.collect()
    assert list((tmp_path / "spool").iterdir()) == []


def test_relay_through_the_middle_node() -> None:
    a, b, c = (signed_node(k, 1, A, B, C) for k in (A, B, C))
    for n in (a, b, c):
        publish(n, 1)
    session(a, b)
    session(b, c)
    held = {i.meta.origin: i.received_from for i in c.cache}
    assert held == {a.id: b.id, b.id: b.id}


def test_newer_manifest_spreads_and_a_revoked_member_is_then_refused() -> None:
    a, b = signed_node(A, 1, A, B, C), signed_node(B, 1, A, B, C)
    c = signed_node(C, 1, A, B, C)
    publish(c, 1)
    session(c, b)
    assert {i.meta.origin for i in b.cache} == {c.id}
    newer = b.manifest.revoke(c.id)
    a.manifest, a.manifest_envelope = newer, newer.sign(ADMIN)
    _, rb = session(a, b)
    assert rb.manifest_adopted == newer.seq
    assert b.manifest.seq == newer.seq
    assert b.cache == []
    assert b.rejected["revoked"] == 1
    # and the revoked node can no longer gossip with b
    _, rb2 = session(c, b)
    assert rb2.refused == {"revoked": 1}


def test_a_node_without_a_manifest_learns_it_from_its_first_peer() -> None:
    # [fleet] manifest unset: the daemon starts from an empty placeholder (seq 0).
    a = signed_node(A, 3, A, B)
    b = node(B, Manifest(FLEET, 0))
    publish(a, 2)
    _, rb = session(a, b)
    assert rb.manifest_adopted == 3
    assert b.manifest.seq == 3
    assert b.manifest_envelope is not None  # and b can now hand it on
    assert [(i.meta.origin, i.meta.version) for i in b.cache] == [(a.id, 2)]


def test_a_manifest_not_signed_by_the_admin_is_not_learned() -> None:
    forged = manifest(A, B, seq=3)
    a = signed_node(A, 3, A, B)
    a.manifest_envelope = forged.sign(OUT)  # a valid signature, by the wrong key
    b = node(B, Manifest(FLEET, 0))
    publish(a, 2)
    session(a, b)
    assert b.manifest.seq == 0
    assert b.cache == []
    assert b.rejected == {"bad_signature": 1}


def test_outsider_with_a_valid_key_is_refused_after_hello() -> None:
    b = signed_node(B, 1, A, B)
    outsider = signed_node(OUT, 1, OUT)  # believes in its own fleet manifest
    outsider.manifest_envelope = None
    publish(outsider, 1)
    _, rb = session(outsider, b)
    assert rb.refused == {"not_member": 1}
    assert b.cache == []
    assert rb.received == 0


def test_hello_naming_another_node_than_the_handshake_is_refused() -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    publish(a, 1)
    _, rb = session(a, b, a_claims=signed_node(C, 1, C).id)
    assert rb.refused == {"bad_signature": 1}
    assert b.cache == []


def test_garbage_frames_end_only_that_session_and_the_cache_survives() -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    publish(a, 1)
    session(a, b)
    before = list(b.cache)

    async def hostile() -> SessionResult:
        io_evil, io_b = pipe()
        await io_evil.send([b"\xc1\xff garbage that is not msgpack"])
        return await run_session(io_b, b, CTX, peer_id=a.id, initiator=False)

    result = trio.run(hostile)
    assert result.refused == {"malformed": 1}
    assert b.cache == before


class CountingIO(MemoryIO):
    """Counts entry frames being received at once across every session sharing ``live``."""

    def __init__(self, inner: MemoryIO, live: list[int], peak: list[int]) -> None:
        super().__init__(inner._send, inner._recv)
        self.live, self.peak = live, peak

    async def recv(self, max_len: int, sink: FrameSink | None = None) -> bytes | memoryview:
        if max_len <= 1 << 20:  # control frames: not a model-sized buffer
            return await super().recv(max_len, sink)
        self.live[0] += 1
        self.peak[0] = max(self.peak[0], self.live[0])
        try:
            await trio.sleep(0.05)  # a slow link: give the other session every chance
            return await super().recv(max_len, sink)
        finally:
            self.live[0] -= 1


def fan_in(slots: int | None) -> tuple[NodeState, int]:
    """M hears from three peers at once; the most entry frames it received together."""
    peers = [signed_node(k, 1, A, B, C, OUT) for k in (B, C, OUT)]
    m = signed_node(A, 1, A, B, C, OUT)
    for i, p in enumerate(peers):
        publish(p, i + 1)
    ctx = SessionContext(admin_key=public_key_bytes(ADMIN), now=lambda: NOW,
                         receive_slots=trio.Semaphore(slots) if slots else None)
    live, peak = [0], [0]

    async def main() -> None:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for p in peers:
                    io_m, io_p = pipe()
                    nursery.start_soon(lambda io=io_m, p=p: run_session(
                        CountingIO(io, live, peak), m, ctx, peer_id=p.id, initiator=False))
                    nursery.start_soon(lambda io=io_p, p=p: run_session(
                        io, p, CTX, peer_id=m.id, initiator=True))

    trio.run(main)
    return m, peak[0]


def test_receive_slots_bound_entries_in_flight_across_sessions() -> None:
    m, peak = fan_in(1)
    assert len(m.cache) == 3
    assert peak == 1
    m, peak = fan_in(None)  # the same fan-in without slots overlaps all three
    assert len(m.cache) == 3
    assert peak == 3
