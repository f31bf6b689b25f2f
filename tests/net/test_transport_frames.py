"""Framed I/O (peerd.net.framing, re-exported by peerd.net.transport) and identity helpers, without
a network."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from typing import Any, cast

import pytest
import trio
import trio.lowlevel
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from trio.testing import MockClock

from peerd.core.reasons import Reason
from peerd.net.framing import (
    MIN_RECEIVE_RATE_BPS,
    RECEIVE_GRACE_S,
    FramedStream,
    RateFloor,
    ReceiveTooSlowError,
    TrioFramedStream,
)
from peerd.net.transport import (
    FrameTooLargeError,
    PeerStats,
    Stream,
    StreamClosedError,
    TransportTimeoutError,
    read_frame,
    tcp_multiaddr,
    write_frame,
)
from peerd.protocol import frames
from peerd.protocol.identity import node_id_of
from peerd.store.sinks import MemorySink


class FakeRaw:
    """Stands in for a libp2p stream: serves ``incoming`` in pieces, records writes."""

    def __init__(self, incoming: bytes = b"", piece: int = 1 << 20, stall: bool = False) -> None:
        self.incoming = bytearray(incoming)
        self.piece = piece
        self.stall = stall  # after the data runs out: hang (True) or EOF (False)
        self.written = bytearray()
        self.read_calls: list[int] = []

    async def read(self, n: int) -> bytes:
        self.read_calls.append(n)
        await trio.lowlevel.checkpoint()
        if not self.incoming:
            if self.stall:
                await trio.sleep_forever()
            from libp2p.network.stream.exceptions import StreamEOF

            raise StreamEOF()
        take = min(n, self.piece, len(self.incoming))
        out = bytes(self.incoming[:take])
        del self.incoming[:take]
        return out

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.written += data


def make_stream(raw: FakeRaw) -> tuple[Stream, PeerStats]:
    stats = PeerStats()
    return Stream(cast(Any, raw), "12D3KooWtest", stats), stats


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_roundtrip_through_write_and_read() -> None:
    async def main() -> None:
        out = FakeRaw()
        s, stats = make_stream(out)
        await write_frame(s, b"hello")
        await write_frame(s, b"")
        assert bytes(out.written) == frame(b"hello") + frame(b"")
        assert stats.bytes_out == 4 + 5 + 4

        # Delivered one byte at a time: the reader must reassemble.
        inp = FakeRaw(bytes(out.written), piece=1)
        r, rstats = make_stream(inp)
        assert bytes(await read_frame(r, 100)) == b"hello"
        assert bytes(await read_frame(r, 100)) == b""
        assert rstats.bytes_in == len(out.written)

    trio.run(main)


def test_gossip_frame_io_protocol() -> None:
    """Stream.send(parts)/recv(max_len) is peerd.net.gossip's FrameIO: one frame per call."""

    async def main() -> None:
        out = FakeRaw()
        s, _ = make_stream(out)
        await s.send([b"ab", memoryview(b"cd"), bytearray(b""), b"e"])
        assert bytes(out.written) == frame(b"abcde")
        r, _ = make_stream(FakeRaw(bytes(out.written), piece=3))
        assert bytes(await r.recv(5)) == b"abcde"
        r, _ = make_stream(FakeRaw(bytes(out.written)))
        with pytest.raises(FrameTooLargeError):
            await r.recv(4)

    trio.run(main)


def test_oversize_prefix_refused_before_reading_body() -> None:
    async def main() -> None:
        raw = FakeRaw(struct.pack(">I", 2**31) + b"x" * 1000)
        s, stats = make_stream(raw)
        with pytest.raises(FrameTooLargeError) as info:
            await read_frame(s, 1024)
        assert info.value.length == 2**31
        # One error for both framings: the transport's is the protocol's too_large refusal.
        assert isinstance(info.value, frames.FrameTooLargeError)
        assert info.value.reason is Reason.TOO_LARGE
        assert stats.bytes_in == 4  # only the header was consumed
        assert len(raw.incoming) == 1000  # the body is still unread

    trio.run(main)


def test_limit_is_inclusive() -> None:
    async def main() -> None:
        s, _ = make_stream(FakeRaw(frame(b"a" * 10)))
        assert bytes(await read_frame(s, 10)) == b"a" * 10
        s, _ = make_stream(FakeRaw(frame(b"a" * 11)))
        with pytest.raises(FrameTooLargeError):
            await read_frame(s, 10)

    trio.run(main)


def test_truncated_frame_is_closed_error() -> None:
    async def main() -> None:
        s, _ = make_stream(FakeRaw(struct.pack(">I", 100) + b"short"))
        with pytest.raises(StreamClosedError):
            await read_frame(s, 1000)
        s, _ = make_stream(FakeRaw(b"\x00\x00"))  # half a header
        with pytest.raises(StreamClosedError):
            await read_frame(s, 1000)

    trio.run(main)


def test_reads_are_chunked_not_sized_by_the_claim() -> None:
    # A peer claiming a big frame and sending little must not make us ask for (and so
    # allocate) the whole claimed length in one read.
    async def main() -> None:
        raw = FakeRaw(struct.pack(">I", 50 * 1024 * 1024) + b"y" * 10)
        s, _ = make_stream(raw)
        with pytest.raises(StreamClosedError):
            await read_frame(s, 64 * 1024 * 1024)
        assert max(raw.read_calls) <= 1024 * 1024

    trio.run(main)


def test_stalled_header_and_trickled_body_time_out() -> None:
    async def main() -> None:
        s, _ = make_stream(FakeRaw(b"", stall=True))
        with trio.move_on_after(5) as outer, pytest.raises(TransportTimeoutError):
            await read_frame(s, 100, timeout_s=0.05)
        assert not outer.cancelled_caught

        # Header arrives, then the body never completes: bounded by base + len/rate.
        s, _ = make_stream(FakeRaw(struct.pack(">I", 10) + b"abc", stall=True))
        with trio.move_on_after(5) as outer, pytest.raises(TransportTimeoutError):
            await read_frame(s, 100, timeout_s=0.05)
        assert not outer.cancelled_caught

    trio.run(main)


class PacedStream(FramedStream):
    """Serves ``data`` ``chunk`` bytes at a time, one chunk every ``every_s`` (virtual)
    seconds, then stalls: a link of a known rate."""

    peer_id = "12D3KooWpaced"

    def __init__(self, data: bytes, chunk: int, every_s: float) -> None:
        self.data, self.chunk, self.every_s = bytearray(data), chunk, every_s

    async def read_some(self, max_bytes: int) -> bytes:
        if not self.data:
            await trio.sleep_forever()
        await trio.sleep(self.every_s)
        out = bytes(self.data[:min(max_bytes, self.chunk)])
        del self.data[:len(out)]
        return out

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError


def _read_with_floor(stream: PacedStream, length: int) -> tuple[bytes | Exception, float]:
    """Read one frame under the receive floor with a mock clock: (body or error, seconds)."""
    async def main() -> bytes | Exception:
        try:
            with RateFloor(MIN_RECEIVE_RATE_BPS, RECEIVE_GRACE_S, stream.peer_id) as floor:
                return bytes(await stream.recv(length, sink=floor.sink(MemorySink())))
        except ReceiveTooSlowError as exc:
            return exc

    clock = MockClock(autojump_threshold=0)
    return trio.run(main, clock=clock), clock.current_time()


def test_the_receive_floor_cuts_a_slow_frame_and_spares_one_above_it() -> None:
    # Issue 12, item 16: a frame holding a receive slot must arrive at MIN_RECEIVE_RATE_BPS
    # on average once RECEIVE_GRACE_S is over. A body of 3 grace periods' worth at the floor:
    length = int(3 * RECEIVE_GRACE_S * MIN_RECEIVE_RATE_BPS)
    body = os.urandom(length)
    chunk = 64 * 1024

    # An honest link at twice the floor takes 1.5 grace periods, longer than the grace
    # alone: it completes.
    got, took = _read_with_floor(
        PacedStream(frame(body), chunk, chunk / (2 * MIN_RECEIVE_RATE_BPS)), length)
    assert got == body
    assert took == pytest.approx(1.5 * RECEIVE_GRACE_S, rel=0.01)

    # A stream that sends the header and some bytes, then nothing: cut when the grace and
    # the credit those bytes earned run out; a link at half the floor: after ~2 graces.
    got, took = _read_with_floor(PacedStream(frame(body)[:chunk + 4], chunk, 0.0), length)
    assert isinstance(got, ReceiveTooSlowError)
    assert took == pytest.approx(RECEIVE_GRACE_S + chunk / MIN_RECEIVE_RATE_BPS, abs=0.01)
    got, took = _read_with_floor(
        PacedStream(frame(body), chunk, chunk / (MIN_RECEIVE_RATE_BPS / 2)), length)
    assert isinstance(got, ReceiveTooSlowError)
    assert took == pytest.approx(2 * RECEIVE_GRACE_S, abs=1.0)  # a chunk is 0.5 s here
    # It is the protocol's refusal (counted as too_slow) and a transport timeout at once.
    assert got.reason is Reason.TOO_SLOW
    assert isinstance(got, TransportTimeoutError)


def test_bad_max_len_rejected() -> None:
    async def main() -> None:
        s, _ = make_stream(FakeRaw(frame(b"x")))
        with pytest.raises(ValueError, match="max_len -1 out of range"):
            await read_frame(s, -1)
        with pytest.raises(ValueError, match=r"max_len \d+ out of range"):
            await read_frame(s, 2**32)

    trio.run(main)


# --- identity ---------------------------------------------------------------------------

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _b58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _spec_peer_id(pub: bytes) -> str:
    """The libp2p peer-id spec written out independently of py-libp2p.

    PublicKey protobuf {Type=Ed25519(1), Data=pub} is 36 bytes (< 42), so the multihash is
    the identity hash: 0x00, length 0x24, then the protobuf bytes; base58btc-encoded.
    """
    proto = b"\x08\x01\x12\x20" + pub
    return _b58(b"\x00" + bytes([len(proto)]) + proto)


def _pub(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def _libp2p_peer_id(pub: bytes) -> str:
    """py-libp2p's own peer id for ``pub``: the id its Noise handshake proves."""
    from libp2p.crypto.ed25519 import Ed25519PublicKey
    from libp2p.peer.id import ID

    return str(ID.from_pubkey(Ed25519PublicKey.from_bytes(pub)).to_base58())


def test_node_id_is_the_libp2p_peer_id_by_the_spec_and_by_libp2p() -> None:
    # peerd.protocol computes node ids without libp2p; the transport reports libp2p's ids.
    for i in range(8):
        key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"seed%d" % i).digest())
        node_id = node_id_of(key)
        assert node_id.startswith("12D3KooW")
        assert node_id == _spec_peer_id(_pub(key)) == _libp2p_peer_id(_pub(key))


def test_tcp_multiaddr() -> None:
    assert tcp_multiaddr("10.0.0.1", 4001) == "/ip4/10.0.0.1/tcp/4001"
    assert tcp_multiaddr("fe80::1", 7) == "/ip6/fe80::1/tcp/7"


def test_libp2p_log_noise_is_demoted_not_printed() -> None:
    # A fresh interpreter: pytest hangs its own handlers on every logger, which would hide
    # what happens in the daemon (Python's last-resort handler printing to stderr).
    code = (
        "import logging, sys\n"
        "from peerd.net.mends import apply_library_mends\n"
        "apply_library_mends()\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.DEBUG,\n"
        "                    format='%(name)s %(levelname)s %(message)s')\n"
        "logging.getLogger('libp2p.stream_muxer.yamux').error('routine disconnect %d', 7)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LIBP2P_DEBUG"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "routine disconnect" not in out.stderr
    assert ("peerd.net.transport.libp2p DEBUG ERROR libp2p.stream_muxer.yamux: "
            "routine disconnect 7") in out.stdout


def test_framing_works_over_any_byte_stream() -> None:
    from trio.testing import memory_stream_pair

    async def main() -> None:
        left, right = memory_stream_pair()
        a, b = TrioFramedStream(left, "memory"), TrioFramedStream(right, "memory")
        await a.send([b"ab", memoryview(b"cd")])
        await write_frame(a, b"")
        assert bytes(await b.recv(4)) == b"abcd"
        assert bytes(await read_frame(b, 0)) == b""
        await left.send_all(struct.pack(">I", 5) + b"xyzvw")
        assert bytes(await b.read_exactly(4)) == struct.pack(">I", 5)

    trio.run(main)


def test_framing_module_does_not_import_libp2p() -> None:
    # The libp2p shell (peerd.net.transport, .stream, .mends) must stay the only modules that
    # pull libp2p in.
    code = ("import sys, peerd.net.framing, peerd.net.transport_config\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'libp2p'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
