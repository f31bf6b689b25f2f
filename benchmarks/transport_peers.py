"""The other process of ``benchmarks.bench_transport`` and ``benchmarks.profile_transport``
(B, the receiver), the two-member fleet both ends build from one seed, and the helpers that
start and stop such a child.

    .venv/bin/python -m benchmarks.transport_peers --serve | --serve-session SEED_HEX
        | --serve-tcp-session SEED_HEX  [--mb 44] [--unmended] [--cpu] [--profile PATH]

Run by those benchmarks, not by hand: each mode prints "peer_id port" once listening (raw
TCP: "- port"), then one line per session (see the functions), and ends when stdin closes.
``--unmended`` turns peerd's throughput mends (``peerd.net.mends_throughput``) off, ``--cpu``
adds the CPU seconds each session cost, ``--profile`` writes a cProfile of the sessions.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import hashlib
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import torch
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.entry import Schema
from peerd.core.validate import ValidationLimits
from peerd.net import mends_throughput
from peerd.net.framing import StreamClosedError, TrioFramedStream
from peerd.net.gossip import SessionContext, run_session
from peerd.net.transport import (
    Stream,
    Transport,
    TransportConfig,
    open_transport,
    read_frame,
    write_frame,
)
from peerd.node.state import NodeState, sign_own
from peerd.protocol.identity import private_key_from_seed, public_key_bytes
from peerd.protocol.manifest import Manifest

if TYPE_CHECKING:
    # trio_typing (a py-libp2p dependency) installs trio-stubs, which shadow trio's own
    # annotations for mypy and lack TaskStatus; the runtime never imports this.
    from trio_typing import TaskStatus

#: Raw TCP receive size, the same as peerd.net.framing's READ_CHUNK_LEN.
CHUNK = 1 << 20


LOOPBACK = TransportConfig(listen_host="127.0.0.1")


FLEET = bytes(range(16))


#: Rows of the benchmark model's weight matrices; columns follow from the entry size.
MODEL_ROWS = 4


#: Weights are small (the validator's default norm limit is 1e4) but not all zero.
WEIGHT_SCALE = 0.01


#: Keeps received entries fresh for the whole run (wall-clock τ_max, seconds).
TAU_MAX_S = 3600.0


#: Any one case taking longer means something hangs; fail instead of stalling.
CASE_TIMEOUT_S = 300.0


async def _serve(limit: int) -> None:
    """Receiver in its own process (--serve): prints "peer_id port", serves until stdin EOF."""

    async def receiver(stream: Stream) -> None:
        while True:
            body = await read_frame(stream, limit)
            await write_frame(stream, b"k" if len(body) else b"")

    async with open_transport(Ed25519PrivateKey.generate(), receiver, LOOPBACK) as b:
        print(b.peer_id, b.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


async def _serve_sessions(n_params: int, seed: bytes, cpu: bool = False,
                          profiler: cProfile.Profile | None = None) -> None:
    """B in its own process (--serve-session): prints "peer_id port", then one line per
    session, the number of entries it verified and cached ("error …" if the session
    raised; with ``cpu``, followed by this process's CPU seconds since the previous line,
    and those of its event-loop thread alone: the process's include the verification
    worker's torch threads, whose spin-waits grow with the machine's load), and serves
    until stdin EOF. A ``profiler`` runs during every session but the first (the
    warm-up)."""
    fleet = Fleet(n_params, seed, sign=False)
    last_cpu = [time.process_time(), time.thread_time()]
    sessions = [0]

    async def receiver(stream: Stream) -> None:
        sessions[0] += 1
        profile = profiler if sessions[0] > 1 else None
        if profile:
            profile.enable()
        try:
            result = await run_session(stream, fleet.fresh_b(), fleet.ctx,
                                       peer_id=stream.peer_id, initiator=False)
        except Exception as exc:
            print("error", repr(exc), flush=True)
            raise
        finally:
            if profile:
                profile.disable()
        now = [time.process_time(), time.thread_time()]
        print(result.received, *([f"{t - t0:.4f}" for t, t0 in zip(now, last_cpu, strict=True)]
                                 if cpu else []), flush=True)
        last_cpu[:] = now

    async with open_transport(fleet.key_b, receiver, LOOPBACK) as b:
        print(b.peer_id, b.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


async def _serve_tcp_sessions(n_params: int, seed: bytes) -> None:
    """B over raw TCP in its own process (--serve-tcp-session): prints "- port", then, like
    ``_serve_sessions``, one line per session on the one connection it accepts."""
    fleet = Fleet(n_params, seed, sign=False)

    async def receiver(stream: trio.SocketStream) -> None:
        io = TrioFramedStream(stream, "a")
        with contextlib.suppress(StreamClosedError):  # the parent hung up: the run is over
            while True:
                result = await run_session(io, fleet.fresh_b(), fleet.ctx, peer_id=fleet.a.id,
                                           initiator=False)
                print(result.received, flush=True)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, receiver, 0,
                                                          host="127.0.0.1"))
        print("-", listeners[0].socket.getsockname()[1], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


async def _read_lines(stream: trio.abc.ReceiveStream,
                      lines: trio.MemorySendChannel[str]) -> None:
    """Forwards ``stream``'s lines until EOF, then closes ``lines``."""
    async with lines:
        buf = b""
        while chunk := await stream.receive_some(4096):
            *whole, buf = (buf + chunk).split(b"\n")
            for line in whole:
                await lines.send(line.decode())


async def spawn(nursery: trio.Nursery, *args: str
                 ) -> tuple[trio.Process, trio.MemoryReceiveChannel[str], str, str]:
    """A child ``--serve…`` process: (process, its stdout lines after the first, its libp2p
    peer id, its port). Cancelling ``nursery`` kills it; closing its stdin ends it."""
    cmd = [sys.executable, "-m", "benchmarks.transport_peers", *args]
    proc: trio.Process = await nursery.start(functools.partial(
        trio.run_process, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, check=False))
    send, lines = trio.open_memory_channel[str](100)
    assert proc.stdout is not None
    nursery.start_soon(_read_lines, proc.stdout, send)
    with trio.fail_after(CASE_TIMEOUT_S):
        peer_id, port = (await lines.receive()).split()
    return proc, lines, peer_id, port


async def end(proc: trio.Process) -> None:
    """Closes the child's stdin and waits for it to exit cleanly."""
    assert proc.stdin is not None
    await proc.stdin.aclose()
    with trio.fail_after(30):
        assert await proc.wait() == 0, proc.returncode


async def no_handler(stream: Stream) -> None:
    return None


def n_params(mb: float) -> int:
    """float32 parameters of a ``mb`` MB entry (the same in the parent and the child)."""
    return int(mb * 1_000_000) // 4


def _model(n_params: int, *, values: bool = True) -> dict[str, torch.Tensor]:
    """The benchmark model; with ``values=False`` only its shapes (meta tensors)."""
    g = torch.Generator().manual_seed(0)
    cols = n_params // MODEL_ROWS
    return {f"layer{i}.weight": (torch.randn(cols, generator=g) * WEIGHT_SCALE if values
                                 else torch.empty(cols, device="meta"))
            for i in range(MODEL_ROWS)}


class Fleet:
    """Two members of one fleet: A holds a signed entry, each B starts empty.

    The keys derive from ``seed``, so a child process given the same seed (and model size)
    builds the same manifest, schema and B; it skips signing A's entry (``sign=False``).
    """

    def __init__(self, n_params: int, seed: bytes, *, sign: bool = True) -> None:
        admin, self.key_a, self.key_b = (
            private_key_from_seed(hashlib.sha256(seed + role).digest())
            for role in (b"admin", b"a", b"b"))
        manifest = Manifest(FLEET, 0)
        for k in (self.key_a, self.key_b):
            manifest = manifest.admit(public_key_bytes(k), None)
        self.manifest = manifest
        params = _model(n_params, values=sign)
        self.schema = Schema.of(params)
        self.ctx = SessionContext(admin_key=public_key_bytes(admin), now=time.time)
        self.a = self.node(self.key_a)
        if sign:
            entry, self.message = sign_own(self.key_a, FLEET, params=params, version=1,
                                           created_at=time.time(), num_examples=100)
            self.a.set_own(entry, self.message)
        #: Entries each libp2p-served session cached (checked after the run).
        self.served: list[int] = []

    def node(self, key: Ed25519PrivateKey) -> NodeState:
        return NodeState(key=key, fleet_id=FLEET, manifest=self.manifest, schema=self.schema,
                         limits=ValidationLimits(), tau_max=TAU_MAX_S, capacity=10)

    def frame_parts(self) -> list[bytes | memoryview]:
        return [self.message.head(), memoryview(self.message.payload)]

    def fresh_b(self) -> NodeState:
        return self.node(self.key_b)


async def run_host(handler: Callable[[Stream], Awaitable[None]],
                    key: Ed25519PrivateKey | None = None, *,
                    task_status: TaskStatus[Transport] = trio.TASK_STATUS_IGNORED) -> None:
    async with open_transport(key or Ed25519PrivateKey.generate(), handler, LOOPBACK) as t:
        task_status.started(t)
        await trio.sleep_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--serve", action="store_true", help="acknowledge each frame")
    mode.add_argument("--serve-session", metavar="SEED_HEX", help="gossip sessions, libp2p")
    mode.add_argument("--serve-tcp-session", metavar="SEED_HEX", help="the same, raw TCP")
    ap.add_argument("--mb", type=float, default=44.0)
    ap.add_argument("--unmended", action="store_true", help="mends 10-14 off")
    ap.add_argument("--cpu", action="store_true", help="report CPU seconds per session")
    ap.add_argument("--profile", metavar="PATH", help="cProfile of the sessions, to PATH")
    args = ap.parse_args()
    if args.unmended:
        mends_throughput.set_enabled(False)
    if args.serve:
        trio.run(_serve, int(args.mb * 1_000_000) + CHUNK)
    elif args.serve_session:
        # benchmarks.profile_transport: B's side under cProfile (CPU of this thread only)
        profiler = cProfile.Profile(time.thread_time) if args.profile else None
        trio.run(_serve_sessions, n_params(args.mb), bytes.fromhex(args.serve_session),
                 args.cpu, profiler)
        if profiler:
            profiler.dump_stats(args.profile)
    else:
        trio.run(_serve_tcp_sessions, n_params(args.mb), bytes.fromhex(args.serve_tcp_session))


if __name__ == "__main__":
    main()
