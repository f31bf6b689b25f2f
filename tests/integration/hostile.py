"""A test-only hostile peer: a real libp2p host with its own key that speaks peerd's session
protocol (peerd/net/gossip.py) to a running daemon, and misbehaves on purpose.

It always plays the initiator: Hello, (no manifest: it claims the daemon's manifest seq),
Digest, Want, then its announced entries, then reads the daemon's (empty) announcement.
Each ``Hostile`` method is one session that sends one kind of bad input; the daemon must
count it under its reason, end at most that session, and keep running and keeping its cache.

Usage (in a test, on the test's own thread)::

    with hostile_peer(key, fleet_id, seq, target) as h:
        h.offer([good_entry])                         # accepted
        h.offer([corrupt(entry)])                     # payload_mismatch
        h.raw_frames([b"\\xc1" * 64])                 # malformed
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.gossip import CAPABILITIES
from peerd.net.transport import Stream, TransportConfig, TransportError, open_transport
from peerd.node.state import sign_own
from peerd.protocol import messages as msg
from peerd.protocol.identity import node_id_of
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN

#: Each hostile session must end quickly: the daemon answers within one frame timeout.
SESSION_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Target:
    node_id: str
    addr: str  # multiaddr without /p2p/


@dataclass
class Reply:
    """What the daemon said in one session: its Hello, its Want, and an Error frame if any."""

    hello: msg.Hello | None = None
    want: msg.Want | None = None
    error: msg.Error | None = None
    closed: str | None = None  # the stream ended early (reset or EOF), and how


def make_entry(key: Ed25519PrivateKey, fleet_id: bytes, params: Mapping[str, torch.Tensor],
               version: int, created_at: float, num_examples: int = 100) -> msg.Entry:
    return sign_own(key, fleet_id, params=params, version=version, created_at=created_at,
                    num_examples=num_examples)[1]


def corrupt(entry: msg.Entry) -> msg.Entry:
    """The same signed envelope with one payload byte flipped (the signature still verifies:
    only the payload hash can tell)."""
    payload = bytearray(entry.payload)
    payload[len(payload) // 2] ^= 0xFF
    return msg.Entry(entry.envelope, bytes(payload))


def item_of(entry: msg.Entry, version: int | None = None) -> msg.DigestItem:
    """The digest line announcing ``entry`` (optionally lying about its version)."""
    from peerd.protocol.entry import EntryBody

    body = EntryBody.from_bytes(entry.envelope.body)
    return msg.DigestItem(body.origin, body.version if version is None else version,
                          body.created_at, bytes.fromhex(body.digest))


async def _recv(stream: Stream, reply: Reply) -> msg.Message | None:
    try:
        m = msg.decode_frame(await stream.recv(MAX_CONTROL_FRAME_LEN))
    except TransportError as exc:
        reply.closed = str(exc)
        return None
    if isinstance(m, msg.Error):
        reply.error = m
        return None
    return m


class Hostile:
    """Runs sessions against ``target`` from a trio loop on a background thread, so tests
    stay synchronous."""

    def __init__(self, key: Ed25519PrivateKey, fleet_id: bytes, manifest_seq: int,
                 target: Target) -> None:
        self.key, self.fleet_id, self.seq, self.target = key, fleet_id, manifest_seq, target
        self.id = node_id_of(key)
        self._token: trio.lowlevel.TrioToken | None = None
        self._transport: Any = None
        self._stop = threading.Event()
        self._stopping: trio.Event | None = None  # the loop's own view of _stop
        self._up = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    # -- loop thread
    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test by start()/run()
            self._error = exc
            self._up.set()

    async def _serve(self) -> None:
        async def refuse(stream: Stream) -> None:
            return  # the daemon may dial back: it gets an empty stream, not a session

        cfg = TransportConfig(listen_host="127.0.0.1", listen_port=0)
        async with open_transport(self.key, refuse, cfg) as transport:
            self._transport = transport
            self._stopping = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._up.set()
            # close() sets _stop before it reads _token: had it read None, _stop is set now.
            if not self._stop.is_set():
                await self._stopping.wait()

    def start(self) -> None:
        self._thread.start()
        self._up.wait(60)
        if self._error is not None or self._token is None:
            raise RuntimeError(f"hostile host did not start: {self._error!r}")

    def close(self) -> None:
        self._stop.set()
        token, stopping = self._token, self._stopping
        if token is not None and stopping is not None:
            with suppress(trio.RunFinishedError):  # the loop already ended (it failed)
                trio.from_thread.run_sync(stopping.set, trio_token=token)
        self._thread.join(30)

    def run(self, script: Callable[[Stream, Reply], Any]) -> Reply:
        """One session: open a stream to the target and run ``script`` on it."""
        async def one() -> Reply:
            reply = Reply()
            with trio.fail_after(SESSION_TIMEOUT_S):
                async with self._transport.open_stream(self.target.node_id,
                                                       [self.target.addr]) as stream:
                    await script(stream, reply)
            return reply

        assert self._token is not None
        return trio.from_thread.run(one, trio_token=self._token)

    # -- scripts
    async def _hello(self, stream: Stream, reply: Reply, node_id: str | None = None) -> bool:
        await stream.send([msg.Hello(self.fleet_id, node_id or self.id, self.seq,
                                     CAPABILITIES).head()])
        m = await _recv(stream, reply)
        if isinstance(m, msg.Hello):
            reply.hello = m
            return True
        return False

    def offer(self, entries: Sequence[msg.Entry],
              announce: Sequence[msg.DigestItem] | None = None) -> Reply:
        """A full session offering ``entries`` (announced as ``announce``, default: as they
        are) and sending those the daemon asks for, in its order."""
        items = list(announce) if announce is not None else [item_of(e) for e in entries]
        by_key = {(i.origin, i.version): e for i, e in zip(items, entries, strict=True)}

        async def script(stream: Stream, reply: Reply) -> None:
            if not await self._hello(stream, reply):
                return
            await stream.send([msg.Digest(tuple(items)).head()])
            if not isinstance(await _recv(stream, reply), msg.Digest):
                return
            await stream.send([msg.Want(()).head()])  # we want nothing of theirs
            want = await _recv(stream, reply)
            if not isinstance(want, msg.Want):
                return
            reply.want = want
            sending = [k for k in want.items if k in by_key]
            await stream.send([msg.Digest(tuple(
                i for i in items if (i.origin, i.version) in sending)).head()])
            for k in sending:
                e = by_key[k]
                await stream.send([e.head(), memoryview(e.payload)])
            await _recv(stream, reply)  # their announcement (empty: we asked for nothing)

        return self.run(script)

    def raw_frames(self, frames: Sequence[bytes], *, after_hello: bool = False) -> Reply:
        """Send ``frames`` as frame bodies (valid length prefixes, arbitrary contents)."""
        async def script(stream: Stream, reply: Reply) -> None:
            if after_hello and not await self._hello(stream, reply):
                return
            for f in frames:
                await stream.send([f])
            await _recv(stream, reply)

        return self.run(script)

    def oversize_prefix(self, length: int = 2**31) -> Reply:
        """A length prefix far above any limit, and no body."""
        async def script(stream: Stream, reply: Reply) -> None:
            await stream.write(struct.pack(">I", length))
            await _recv(stream, reply)

        return self.run(script)

    def hello_as(self, node_id: str) -> Reply:
        """A Hello claiming another node's id than the one our key proved."""
        async def script(stream: Stream, reply: Reply) -> None:
            # The daemon answers our Hello with its own before it checks ours: the verdict
            # is the frame after that.
            if await self._hello(stream, reply, node_id=node_id):
                await _recv(stream, reply)

        return self.run(script)


@contextmanager
def hostile_peer(key: Ed25519PrivateKey, fleet_id: bytes, manifest_seq: int,
                 target: Target) -> Iterator[Hostile]:
    h = Hostile(key, fleet_id, manifest_seq, target)
    h.start()
    try:
        yield h
    finally:
        h.close()
