"""One member of a two-member fleet across the namespace WAN's shaped uplink (issue 27, items
4-5): the receiver and the sender of tests/net/test_slowlink.py and benchmarks/bench_slowlink.py,
each in its own namespace, each a real peerd transport (libp2p, Noise, Yamux) running
peerd's gossip sessions.

    python -m tests.net.slowlink_peer recv --port P --mb MB --spool DIR
    python -m tests.net.slowlink_peer send --port P --mb MB --spool DIR --to IP [--encoding E]

Both build the fleet from one fixed seed, so the sender knows the receiver's id. The receiver
keeps cut transfers as the daemon does (``Partials``, a spool directory) and prints
``{"ready": ID}`` once listening, then one JSON line per session: entries cached, the bytes
that reached it in that session (every frame, entry or not), its resume counters, and when
the session began and ended (wall clock, seconds). The
sender holds one entry of ``--mb`` MB of float32 parameters, signed in ``--encoding``, and
dials the receiver until a session gets it across, as the daemon's gossip loop would (a
session that fails is retried ``RETRY_S`` later); it prints ``{"signed": BYTES}`` with the
entry frame's length, one line per session, then exits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import trio

from peerd.core.entry import Schema
from peerd.core.validate import ValidationLimits
from peerd.net.framing import AfterPart, FrameSink
from peerd.net.gossip import FrameIO, SessionContext, run_session
from peerd.net.transport import Stream, TransportConfig, TransportError, open_transport
from peerd.node.state import NodeState, sign_own
from peerd.protocol.encoding import Encoding
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import private_key_from_seed, public_key_bytes
from peerd.protocol.manifest import Manifest
from peerd.store.partials import Partials

FLEET = bytes(range(16))
SEED = b"slowlink"
ROWS = 4
#: Between two sessions of the sender that did not get the entry across (the daemon's gossip
#: sweep is 3 s on average; shorter here, so the test measures the link, not the wait).
RETRY_S = 0.5
#: A dial that has not connected this long is retried (the link may still be cut).
DIAL_TIMEOUT_S = 5.0


class Fleet:
    def __init__(self, mb: float) -> None:
        admin, self.key_a, self.key_b = (
            private_key_from_seed(hashlib.sha256(SEED + role).digest())
            for role in (b"admin", b"a", b"b"))
        manifest = Manifest(FLEET, 0)
        for k in (self.key_a, self.key_b):
            manifest = manifest.admit(public_key_bytes(k), None)
        self.manifest = manifest
        self.cols = int(mb * 1_000_000) // 4 // ROWS
        self.schema = Schema.of(self.params(values=False))
        self.admin = public_key_bytes(admin)

    def params(self, *, values: bool = True) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        # Small weights (the validator's norm limit), not all zero (int8 needs a scale).
        return {f"layer{i}.weight": (torch.randn(self.cols, generator=g) * 0.01 if values
                                     else torch.empty(self.cols, device="meta"))
                for i in range(ROWS)}

    def node(self, key: Any) -> NodeState:
        return NodeState(key=key, fleet_id=FLEET, manifest=self.manifest, schema=self.schema,
                         limits=ValidationLimits(), tau_max=3600.0, capacity=10)


class _CountingSink:
    def __init__(self, inner: FrameSink, counter: list[int]) -> None:
        self._inner, self._counter = inner, counter

    def begin(self, length: int) -> None:
        self._inner.begin(length)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._counter[0] += len(data)
        self._inner.write(data)

    def finish(self) -> memoryview:
        return self._inner.finish()

    def abort(self) -> None:
        self._inner.abort()


class Counted:
    """A session's frames, counted: bytes handed to ``send`` and bytes ``recv`` got (a frame
    cut short counts what did arrive)."""

    def __init__(self, io: FrameIO) -> None:
        self._io = io
        self.sent = 0
        self._received = [0]

    @property
    def received(self) -> int:
        return self._received[0]

    async def send(self, parts: Sequence[bytes | memoryview],
                   after_part: AfterPart | None = None) -> None:
        await self._io.send(parts, after_part)
        self.sent += sum(len(p) for p in parts)

    async def recv(self, max_len: int,
                   sink: FrameSink | None = None) -> bytes | bytearray | memoryview:
        if sink is not None:
            return await self._io.recv(max_len, _CountingSink(sink, self._received))
        frame = await self._io.recv(max_len)
        self._received[0] += len(frame)
        return frame


def _line(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def receive(port: int, fleet: Fleet, spool: Path) -> None:
    partials = Partials()  # the daemon's bounds: 1 MiB at least, 4 at most
    ctx = SessionContext(admin_key=fleet.admin, now=time.time, spool_dir=spool,
                         partials=partials)
    node = fleet.node(fleet.key_b)  # one node across sessions, as a daemon's

    async def handler(stream: Stream) -> None:
        io = Counted(stream)
        t0 = time.time()
        error = None
        received = 0
        try:
            result = await run_session(io, node, ctx, peer_id=stream.peer_id,
                                       initiator=False)
            received = result.received
        except (TransportError, ProtocolError, trio.TooSlowError) as exc:
            error = repr(exc)[:200]
        _line(received=received, bytes_in=io.received, error=error,
              resumed=partials.resumed, bytes_not_resent=partials.bytes_saved,
              cached=len(node.cache), t_start=t0, t_end=time.time())

    async with open_transport(fleet.key_b, handler,
                              TransportConfig(listen_host="0.0.0.0", listen_port=port)) as t:
        _line(ready=t.peer_id)
        await trio.to_thread.run_sync(sys.stdin.read)


async def send(port: int, fleet: Fleet, to: str, encoding: Encoding, spool: Path) -> None:
    node = fleet.node(fleet.key_a)
    entry, message = sign_own(fleet.key_a, FLEET, params=fleet.params(), version=1,
                              created_at=time.time(), num_examples=100, encoding=encoding)
    node.set_own(entry, message)
    _line(signed=len(message.head()) + len(message.payload))
    # Spool and partials as every daemon has them: a Hello announces resume/v1 only then,
    # and a cut transfer resumes only between two peers that both announce it.
    ctx = SessionContext(admin_key=fleet.admin, now=time.time, spool_dir=spool,
                         partials=Partials())
    peer = fleet.node(fleet.key_b).id
    addr = f"/ip4/{to}/tcp/{port}"
    t0 = time.monotonic()
    async with open_transport(fleet.key_a, _refuse, TransportConfig(listen_port=0)) as t:
        while True:
            error = None
            sent = 0
            io = None
            try:
                async with t.open_stream(peer, [addr], timeout_s=DIAL_TIMEOUT_S) as stream:
                    io = Counted(stream)
                    sent = (await run_session(io, node, ctx, peer_id=peer,
                                              initiator=True)).sent
            except (TransportError, ProtocolError, trio.TooSlowError) as exc:
                error = repr(exc)[:200]
            _line(sent=sent, bytes_out=io.sent if io else 0, error=error,
                  at_s=round(time.monotonic() - t0, 3))
            if sent:
                return
            await trio.sleep(RETRY_S)


async def _refuse(stream: Stream) -> None:
    return None  # the receiver never dials: the sender is behind its site's NAT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("recv", "send"))
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mb", type=float, required=True)
    ap.add_argument("--spool", type=Path, required=True)
    ap.add_argument("--to")
    ap.add_argument("--encoding", type=Encoding.parse, default=Encoding())
    args = ap.parse_args()
    fleet = Fleet(args.mb)
    args.spool.mkdir(parents=True, exist_ok=True)
    if args.mode == "recv":
        trio.run(receive, args.port, fleet, args.spool)
    else:
        trio.run(send, args.port, fleet, args.to, args.encoding, args.spool)


if __name__ == "__main__":
    main()
