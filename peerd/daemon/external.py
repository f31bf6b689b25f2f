"""``[learner] kind = "external"``: the learner socket a training process attaches to.

The daemon runs no training of its own. A process the user starts (:mod:`peerd.client`)
connects to ``<state_dir>/learner.sock`` (protocol: :mod:`peerd.learn.learner.external`)
and loops: ``blend`` (x̄ as the weight-mode round would blend the cache now, written into
the client's buffer by :func:`peerd.learn.trainer.blend_now`) → train → ``publish`` (checked
as a worker's result is; the round loop is woken and its next round signs and gossips it:
:meth:`ExternalSide.take` in the weight mode's step).

The socket is bound by the control socket's own code (:func:`open_control_listener`: 0600,
or 0660 to ``[node] socket_group``, never reachable wider while binding). Every client is
served in a task of its own: what it sends, or its end of file, or its death mid-frame, ends
that connection and nothing else; no exception of a client's handler leaves it.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio
from torch import nn

from peerd.control.server import open_control_listener
from peerd.control.status import ExternalStatus
from peerd.learn.learner.check import FleetSchema, bounded
from peerd.learn.learner.contract import FitResult, LearnerError
from peerd.learn.learner.external import (
    API_VERSION,
    BLEND_SEALS,
    FRAME_TIMEOUT_S,
    MAX_CLIENTS,
    MAX_FDS,
    PUBLISH_WAIT_S,
    BufferError,
    accept_publish,
    check_buffer,
    map_fd,
)
from peerd.learn.learner.stats import LearnerStats
from peerd.learn.learner.wire import HEADER_LEN, WireError, frame, frame_length, parse
from peerd.learn.trainer import Blended, RoundInput, blend_now

log = logging.getLogger(__name__)

_ANC = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


class ExternalHost(Protocol):
    """What the socket needs of weight mode (:class:`peerd.daemon.modes.weights.WeightsMode`)."""

    def blend_input(self) -> tuple[RoundInput, int]:
        """On the loop thread: stale entries expired, the round's input as of now and the
        own example count; the caller calls :meth:`blend_done` once it has blended."""

    def blend_done(self) -> None: ...

    def refused(self, exc: LearnerError) -> None:
        """A publish refused by the checks: counted, logged, audited as a round's would be."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the round that carried a publish did with it."""

    round: int
    version: int | None  # None: not published (it moved no more than epsilon)


class _GoneError(Exception):
    """The client closed its end (or died), or broke the framing: drop the connection."""


def _error(code: str, message: str, **more: Any) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message, **more}}


class ExternalSide:
    """The daemon's half of an external learner: the socket, the pending publish, the numbers
    status shows."""

    def __init__(self, *, path: Path, group: str | None, model: nn.Module, schema: FleetSchema,
                 hello: dict[str, Any], max_examples: int | None, stats: LearnerStats,
                 clock: Callable[[], float]) -> None:
        self.path, self.group, self.model, self.schema = path, group, model, schema
        self.hello, self.max_examples, self.stats, self.clock = hello, max_examples, stats, clock
        self.host: ExternalHost | None = None  # set by the mode that owns this side
        #: The model is read by a blend and written by a round's publish: one at a time.
        self.lock = trio.Lock()
        self.clients = 0
        self.blends = 0
        self.publishes = 0
        self.last_publish: float | None = None
        self.last_version: int | None = None
        #: The last blend served (α, norms: what the round carrying the next publish reports).
        self.last_blend: Blended | None = None
        self._pending: FitResult | None = None
        self._waiter: trio.Event | None = None
        self._taken = False
        self._outcome: Outcome | None = None
        self._wake = trio.Event()
        self._listener: trio.SocketListener | None = None

    # ------------------------------------------------------------------ the round's side
    async def round_wanted(self) -> None:
        """Returns when a publish waits for its round (the round loop waits on this)."""
        await self._wake.wait()
        self._wake = trio.Event()

    def take(self) -> FitResult | None:
        """The checked publish waiting for this round (it is this round's trained model), or
        None. Called by the weight mode's step on the loop thread."""
        if self._taken and self._waiter is not None:
            self._finish(None)  # the round that took the last one raised before its end
        result, self._pending = self._pending, None
        self._taken = result is not None
        return result

    def round_done(self, round_no: int, version: int | None) -> None:
        """The round ended (its audit): tell the publish it carried, if any."""
        if self._taken:
            self.last_version = version
            self._finish(Outcome(round_no, version))

    def _outcome_of(self, waiter: trio.Event) -> Outcome | None:
        return self._outcome if waiter.is_set() else None

    def _finish(self, outcome: Outcome | None) -> None:
        self._outcome, self._taken = outcome, False
        if self._waiter is not None:
            self._waiter.set()

    def status(self) -> ExternalStatus:
        return ExternalStatus(socket=str(self.path), clients=self.clients, blends=self.blends,
                              publishes=self.publishes, last_publish=self.last_publish,
                              last_version=self.last_version)

    # ------------------------------------------------------------------ the socket
    async def open(self) -> None:
        """Bind the socket (before READY=1, as the control socket)."""
        self._listener = await open_control_listener(self.path, group=self.group)

    async def serve(self) -> None:
        """Serve clients until cancelled, then remove the socket (if it is still ours)."""
        if self._listener is None:
            await self.open()
        listener = self._listener
        assert listener is not None
        ino = self.path.stat().st_ino
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    stream = await listener.accept()
                    nursery.start_soon(self._client, stream)
        finally:
            with contextlib.suppress(OSError):
                if self.path.stat().st_ino == ino:
                    self.path.unlink()
            await listener.aclose()

    async def _client(self, stream: trio.SocketStream) -> None:
        async with stream:
            if self.clients >= MAX_CLIENTS:
                await _turn_away(stream)
                return
            self.clients += 1
            try:
                await self._converse(stream)
            except (_GoneError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.debug("external learner client went away: %s", exc)
            except Exception:
                # An exception escaping would cancel the daemon's nursery: one client must
                # never stop the node.
                log.exception("external learner socket: unexpected error serving a client")
            finally:
                self.clients -= 1

    async def _converse(self, stream: trio.SocketStream) -> None:
        greeted = False
        while True:
            message, fd = await _read_frame(stream.socket)
            try:
                op = message.get("op")
                if op == "hello":
                    answer = self._hello(message)
                    greeted = answer.get("ok") is True
                elif not greeted:
                    answer = _error("bad_request", "say hello first")
                elif op == "blend":
                    answer = await self._blend(fd)
                    fd = None  # closed by _blend
                elif op == "publish":
                    answer = await self._publish(message, fd)
                    fd = None
                else:
                    answer = _error("bad_request", f"unknown op {bounded(str(op), 40)}")
            finally:
                if fd is not None:
                    os.close(fd)
            await stream.send_all(frame(answer))

    def _hello(self, message: dict[str, Any]) -> dict[str, Any]:
        api = message.get("api")
        if api != API_VERSION or isinstance(api, bool):
            return _error("unsupported_api", f"this daemon speaks external learner API "
                                             f"{API_VERSION}, the client sent {api!r}; use "
                                             "peerd.client of the same release")
        return {"ok": True, "api": API_VERSION, **self.hello}

    async def _blend(self, fd: int | None) -> dict[str, Any]:
        if fd is None:
            return _error("bad_request", "blend came without its buffer")
        try:
            try:
                check_buffer(fd, self.schema, BLEND_SEALS)
            except BufferError as exc:
                return _error("bad_request", str(exc))
            into = map_fd(fd, self.schema, shared=True)
        finally:
            os.close(fd)
        host = self.host
        assert host is not None
        async with self.lock:
            inp, examples = host.blend_input()
            try:
                blended = await trio.to_thread.run_sync(blend_now, self.model, into, inp,
                                                        examples)
            finally:
                host.blend_done()
        del into  # the daemon's mapping goes; the client's pages stay its own
        self.blends += 1
        self.last_blend = blended
        return {"ok": True, "alpha": blended.alpha, "blend_refused": blended.refused}

    async def _publish(self, message: dict[str, Any], fd: int | None) -> dict[str, Any]:
        try:
            if self._pending is not None or self._waiter is not None:
                return _error("busy", "a publish is waiting for its round already")
            try:
                # The finiteness pass reads every value: off the event loop.
                result = await trio.to_thread.run_sync(
                    lambda: accept_publish(message, fd, self.schema,
                                           max_examples=self.max_examples))
            except LearnerError as exc:
                assert self.host is not None
                self.host.refused(exc)
                return _error("refused", exc.detail, reason=exc.reason.value)
        finally:
            if fd is not None:
                os.close(fd)  # the mapping (if any) keeps the pages
        self.publishes += 1
        self.last_publish = self.clock()
        self._pending, self._waiter, self._outcome = result, trio.Event(), None
        del result
        waiter = self._waiter
        self._wake.set()
        try:
            # A client gone meanwhile changes nothing: the round takes the publish anyway.
            with trio.move_on_after(PUBLISH_WAIT_S):
                await waiter.wait()
        finally:
            if self._waiter is waiter:
                self._waiter = None
                self._pending = None  # not taken in time (or the daemon stops): dropped
        outcome = self._outcome_of(waiter)
        if outcome is None:
            return _error("round_failed", "the round that was to sign this publish failed or "
                                          "did not end in time; see the daemon's log")
        return {"ok": True, "round": outcome.round, "published": outcome.version is not None,
                "version": outcome.version}


async def _turn_away(stream: trio.SocketStream) -> None:
    """Answer ``busy`` to a client beyond the cap, then read (and drop) what it sent for a
    moment: closing a Unix socket with unread input resets it, and the client would see a
    reset instead of the answer. Bounded in time, so turned-away clients cost a second each."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError), \
            trio.move_on_after(1.0):
        await stream.send_all(frame(_error(
            "busy", f"{MAX_CLIENTS} clients are attached already, the most this daemon "
                    "serves at once")))
        await stream.send_eof()
        while await stream.receive_some(1 << 16):
            pass


async def _recv(sock: trio.socket.SocketType, n: int, fds: list[int]) -> bytes:
    """Up to ``n`` bytes, the descriptors that came with them appended to ``fds``."""
    data, anc, flags, _ = await sock.recvmsg(n, _ANC, socket.MSG_CMSG_CLOEXEC)
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(raw[:len(raw) - len(raw) % got.itemsize])
            fds.extend(got)
    if flags & socket.MSG_CTRUNC or len(fds) > MAX_FDS:
        for fd in fds:
            os.close(fd)
        fds.clear()
        raise _GoneError(f"more than {MAX_FDS} descriptor in one frame")
    if not data:
        raise _GoneError("end of file")
    return bytes(data)


async def _read_exact(sock: trio.socket.SocketType, n: int, fds: list[int],
                      head: bytes = b"") -> bytes:
    buf = bytearray(head)
    while len(buf) < n:
        buf += await _recv(sock, n - len(buf), fds)
    return bytes(buf)


async def _read_frame(sock: trio.socket.SocketType) -> tuple[dict[str, Any], int | None]:
    """The next frame and the descriptor it carried (closed by the caller). Waits as long
    as the client trains for its first byte, then :data:`FRAME_TIMEOUT_S` for the rest."""
    fds: list[int] = []
    try:
        first = await _recv(sock, HEADER_LEN, fds)
        with trio.fail_after(FRAME_TIMEOUT_S):
            header = await _read_exact(sock, HEADER_LEN, fds, first)
            body = await _read_exact(sock, frame_length(header), fds)
        message = parse(body)
    except (WireError, trio.TooSlowError) as exc:
        for fd in fds:
            os.close(fd)
        raise _GoneError(f"a broken frame: {exc}") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds[0] if fds else None
