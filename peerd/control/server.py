"""The local control API: a Unix socket on which ``peerd status`` / ``peerd peers`` ask the daemon.

Protocol (API version 1): the client connects, sends one JSON object on one line
``{"api": 1, "method": "status"}`` and reads one JSON line back, then the server closes:

* ``{"api": 1, "ok": true, "result": {...}}`` -- ``status`` returns the full status
  (:func:`peerd.control.status.to_json`), ``peers`` returns ``{"peers": [...]}``, ``flags``
  the origins flagged for equivocation (:class:`peerd.control.status.Flags`), and
  ``{"api": 1, "method": "clear_flag", "origin": "<node id>"}`` clears one (persisted before
  the answer; error ``not_flagged`` if it was not flagged) and answers like ``flags``;
  ``{"api": 1, "method": "audit", "since": N}`` returns the participation audit of rounds
  >= N (``since`` optional; :mod:`peerd.control.audit`);
* ``{"api": 1, "ok": false, "error": {"code": "...", "message": "..."}}`` for a bad request,
  an API version the server does not speak, an unknown method or a provider failure.

Local clients cannot lock a genuine one out: open connections are capped and the oldest one
that has not sent its request yet is closed to make room for a new one, the request line has
a short deadline, and an oversize request gets its ``too_large`` answer (what it still sends is
read and dropped, so the client is not reset before it reads it).

Access control is the socket file's mode: 0600 (the daemon's user only) or 0660 with a group
(``[node] socket_group``). The file is bound inside a private 0700 directory, chmod-ed and
only then renamed into place, so it is never reachable with wider permissions, even briefly.
The server runs on trio (the daemon's event loop, because py-libp2p is trio-based); the client
is synchronous stdlib code so the CLI stays light (:mod:`peerd.control.client`, whose names
this module re-exports).

This module owns the socket and the request/response envelope, not the status' shape
(:mod:`peerd.control.status`); it must not import the daemon.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

# The client half and what both ends share; re-exported: callers import them from here too.
from peerd.control.client import API_VERSION as API_VERSION
from peerd.control.client import CONNECT_RETRY_MAX_S as CONNECT_RETRY_MAX_S
from peerd.control.client import CONNECT_RETRY_S as CONNECT_RETRY_S
from peerd.control.client import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
from peerd.control.client import MAX_CONTROL_JSON_DEPTH, json_too_deep
from peerd.control.client import MAX_RESPONSE_LEN as MAX_RESPONSE_LEN
from peerd.control.client import ControlError as ControlError
from peerd.control.client import decode_result as decode_result
from peerd.control.client import request as request
from peerd.control.client import request_clear_flag as request_clear_flag
from peerd.control.client import request_flags as request_flags
from peerd.control.client import request_peers as request_peers
from peerd.control.client import request_status as request_status
from peerd.control.connections import Connection, Connections
from peerd.control.status import Flags, Status, flags_to_json, peers_to_json, to_json

log = logging.getLogger(__name__)

METHODS = ("status", "peers", "flags", "clear_flag", "audit")
#: Largest request: a request is ~40 bytes; a local process must not make us buffer more.
MAX_REQUEST_LEN = 4096
#: Bytes of an oversized request read and dropped so that a client still sending it (a plain
#: ``sendall`` of 10 MB, then a read) gets to read our error instead of a reset: closing a
#: Unix socket with unread input resets it. Dropped as it arrives (no memory), bounded so a
#: client streaming forever cannot keep us reading; a bigger request may see a reset.
MAX_DRAIN_LEN = 64 * 1024**2
#: How long a connection may take to send its request line: a genuine client sends its ~40
#: bytes right after connecting, so a client that connects and says nothing is closed soon
#: and cannot hold a handler (and a file descriptor) for long.
REQUEST_TIMEOUT_S = 2.0
#: How long one connection may take on the server side, all of it (request, answer, drain).
SERVER_TIMEOUT_S = 5.0
#: Connections held open at once (a file descriptor each). When a new one arrives at the cap,
#: the oldest one that owes us its request line (or is only sending an oversize request) is
#: closed to make room: a flood of idle local clients evicts itself, and a genuine client is
#: always accepted and read at once.
MAX_OPEN_CONNECTIONS = 64
#: Connections the kernel queues before we accept them. A full backlog makes a client's
#: connect fail with EAGAIN, so it is sized for a burst while the event loop is busy
#: (the kernel caps it at net.core.somaxconn).
LISTEN_BACKLOG = 256
#: Connections answered at once: a local process opening sockets in a loop gets queued here
#: instead of making the daemon build status dicts without bound.
MAX_CONCURRENT_CLIENTS = 8
#: AF_UNIX sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_LEN = 107
#: Longest origin a ``clear_flag`` request may name (a node id is 52 characters).
MAX_ORIGIN_LEN = 64

#: What the daemon hands the server: a callable returning the current status. It runs in the
#: trio thread, so it must be quick and must not block (read in-memory state only).
StatusProvider = Callable[[], Status]

# ---------------------------------------------------------------------------- server


def _error(code: str, message: str) -> dict[str, Any]:
    return {"api": API_VERSION, "ok": False, "error": {"code": code, "message": message}}


#: An operator's action: clear ``origin``'s equivocation flag (durably); False if it had none.
FlagClearer = Callable[[str], bool]
#: The participation audit of rounds >= ``since`` (None: all kept), as its JSON object.
AuditProvider = Callable[[int | None], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Operations:
    """What a daemon offers on its socket: its status, and the operator's actions. It is a
    :data:`StatusProvider` itself, so the server hands it around as one. The actions run in
    the trio thread like the provider (the daemon's state is only touched there)."""

    status: StatusProvider
    clear_flag: FlagClearer | None = None
    audit: AuditProvider | None = None

    def __call__(self) -> Status:
        return self.status()


def _clear_flag(request: dict[str, Any], ops: Operations) -> dict[str, Any] | None:
    """The error response of a ``clear_flag`` that cannot be done, else None (done)."""
    origin = request.get("origin")
    if not isinstance(origin, str) or not 0 < len(origin) <= MAX_ORIGIN_LEN:
        return _error("bad_request", "clear_flag needs \"origin\": a node id")
    if ops.clear_flag is None:
        return _error("unknown_method", "this daemon cannot clear flags")
    if not ops.clear_flag(origin):
        return _error("not_flagged", f"{origin} is not flagged; `peerd flags` lists the "
                                     "flagged origins")
    return None


def dispatch(raw: bytes, provider: StatusProvider) -> dict[str, Any]:
    """The response to one raw request line (pure apart from the actions of an
    :class:`Operations` provider, so it is tested without sockets)."""
    if json_too_deep(raw):  # json.loads would recurse past Python's limit: see the limit
        return _error("bad_request",
                      f"request nests deeper than {MAX_CONTROL_JSON_DEPTH} levels")
    try:
        request = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return _error("bad_request", "request is not JSON")
    if not isinstance(request, dict):
        return _error("bad_request", "request must be a JSON object")
    api = request.get("api")
    if api != API_VERSION or isinstance(api, bool):
        return _error("unsupported_api",
                      f"this daemon speaks control API {API_VERSION}, the client sent {api!r}; "
                      "use the peerd CLI of the same release")
    method = request.get("method")
    if method not in METHODS:
        return _error("unknown_method",
                      f"unknown method {method!r}; known: {', '.join(METHODS)}")
    if method == "audit":
        return _audit(request, provider)
    cleared = None
    if method == "clear_flag":
        ops = provider if isinstance(provider, Operations) else Operations(provider)
        refused = _clear_flag(request, ops)
        if refused is not None:
            return refused
        cleared = request["origin"]
    try:
        status = provider()
        if method == "status":
            result = to_json(status)
        elif method == "peers":
            result = peers_to_json(status.peers)
        else:
            result = flags_to_json(Flags(running=True, flagged=status.flagged, cleared=cleared))
        json.dumps(result)  # fail here, as an error response, not half-way through sending
    except Exception as exc:
        log.exception("control: status provider failed")
        return _error("internal", f"the daemon could not build its status: {type(exc).__name__}")
    return {"api": API_VERSION, "ok": True, "result": result}


def _audit(request: dict[str, Any], provider: StatusProvider) -> dict[str, Any]:
    since = request.get("since")
    if since is not None and (type(since) is not int or since < 0):
        return _error("bad_request", "audit's \"since\" is a round number >= 0")
    audit = provider.audit if isinstance(provider, Operations) else None
    if audit is None:
        return _error("unknown_method", "this daemon keeps no participation audit")
    try:
        result = audit(since)
        json.dumps(result)
    except Exception as exc:
        log.exception("control: audit provider failed")
        return _error("internal", f"the daemon could not read its audit: {type(exc).__name__}")
    return {"api": API_VERSION, "ok": True, "result": result}


async def _read_line(stream: trio.SocketStream) -> bytes | None:
    buf = bytearray()
    while b"\n" not in buf:
        chunk = await stream.receive_some(MAX_REQUEST_LEN + 1 - len(buf))
        if not chunk:
            break  # EOF without newline: take what came (a client may shut down its side)
        buf += chunk
        if len(buf) > MAX_REQUEST_LEN:
            return None
    return bytes(buf.split(b"\n", 1)[0])


async def _drain(stream: trio.SocketStream) -> None:
    # Closing a Unix socket with unread input resets the connection and the client loses
    # our error response; read (and drop) a bounded amount so it gets to read it.
    left = MAX_DRAIN_LEN
    while left > 0 and (chunk := await stream.receive_some(min(left, 65536))):
        left -= len(chunk)


async def _serve_one(stream: trio.SocketStream, provider: StatusProvider,
                     limiter: trio.CapacityLimiter, conns: Connections, conn: Connection) -> None:
    with trio.move_on_after(REQUEST_TIMEOUT_S) as read_scope:
        line = await _read_line(stream)
    if read_scope.cancelled_caught:
        log.debug("control client sent no request within %ss", REQUEST_TIMEOUT_S)
        return
    conns.evictable(conn, False)  # from here on we owe it an answer
    # The limiter bounds the answers built at once; it is never held while waiting for a
    # client to speak, so idle clients cannot keep a genuine one from its turn.
    async with limiter:
        response = (_error("too_large", f"request over {MAX_REQUEST_LEN} bytes")
                    if line is None else dispatch(line, provider))
        await stream.send_all(json.dumps(response).encode() + b"\n")
    if line is None:
        # The answer is complete (EOF for a client that reads to the end); drop what it is
        # still sending so that it gets to read the answer instead of a reset.
        await stream.send_eof()
        conns.evictable(conn, True)
        await _drain(stream)


async def _handle(stream: trio.SocketStream, provider: StatusProvider,
                  limiter: trio.CapacityLimiter, conns: Connections) -> None:
    async with stream:
        # The outer deadline covers the whole connection; eviction cancels the same scope.
        with trio.move_on_after(SERVER_TIMEOUT_S) as scope:
            conn = Connection(scope)
            if not conns.admit(conn):
                log.debug("control: %d connections answering, dropping a new one", len(conns))
                return
            try:
                await _serve_one(stream, provider, limiter, conns, conn)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.debug("control client went away: %s", exc)
            except Exception:
                # An exception escaping a handler would cancel serve_listeners and with it
                # the daemon's nursery: one bad local client must never stop the node.
                log.exception("control: unexpected error serving a client")
            finally:
                conns.remove(conn)
        if scope.cancelled_caught:
            log.debug("control client timed out or was evicted for a newer one")


def _check_stale(path: Path) -> None:
    """Remove a stale socket left by a crash; refuse if a live daemon or a non-socket is there."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlError("path_in_use", f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale control socket %s (left by a crash)", path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    except OSError:
        pass  # e.g. permission denied: somebody else's live socket, fall through
    finally:
        probe.close()
    raise ControlError("in_use", f"another daemon is already listening on {path}; "
                                 "give each daemon its own [node] socket")


def check_socket_free(path: Path) -> None:
    """What :meth:`ControlServer.open` would refuse, checked before the daemon starts: a path
    too long for AF_UNIX, a file that is not a socket, a live daemon answering on it
    (ControlError ``bad_path``, ``path_in_use``, ``in_use``). A stale socket is removed."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_LEN:
        raise ControlError("bad_path", f"socket path {path} is longer than "
                                       f"{MAX_SOCKET_PATH_LEN} bytes; set [node] socket")
    _check_stale(path)


async def open_control_listener(path: Path, *, group: str | None = None) -> trio.SocketListener:
    """Bind the control socket at ``path`` (0600, or 0660 to ``group``) and listen."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_LEN:
        raise ControlError("bad_path", f"socket path {path} is longer than "
                                       f"{MAX_SOCKET_PATH_LEN} bytes")
    gid = None
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ControlError("bad_group", f"socket_group {group!r} does not exist") from None
    # Parent missing (no systemd RuntimeDirectory, e.g. by hand): make it private, or
    # group-traversable when a group is meant to reach the socket.
    path.parent.mkdir(mode=0o750 if group else 0o700, parents=True, exist_ok=True)
    _check_stale(path)
    private = Path(tempfile.mkdtemp(prefix=".ctl-", dir=path.parent))  # mode 0700
    tmp = private / "s"
    if len(os.fsencode(tmp)) > MAX_SOCKET_PATH_LEN:
        shutil.rmtree(private, ignore_errors=True)
        raise ControlError("bad_path", f"socket directory {path.parent} is too deep for a "
                                       "Unix socket; choose a shorter [node] socket path")
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(str(tmp))
        # Nobody but us can reach it inside the 0700 directory, so fixing the mode now is safe.
        os.chmod(tmp, 0o660 if gid is not None else 0o600)
        if gid is not None:
            os.chown(tmp, -1, gid)
        sock.listen(LISTEN_BACKLOG)
        os.replace(tmp, path)
    except OSError as exc:
        sock.close()
        raise ControlError("bind_failed", f"cannot create control socket {path}: "
                                          f"{exc.strerror}") from exc
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return trio.SocketListener(sock)


class ControlServer:
    """A bound control socket; :meth:`serve` answers requests until cancelled.

    Binding is separate from serving so that start-up fails early and clearly (socket in
    use, bad group) and the daemon sends READY=1 only once the socket accepts connections::

        server = await ControlServer.open(path, provider)
        nursery.start_soon(server.serve)
    """

    def __init__(self, path: Path, listener: trio.SocketListener,
                 provider: StatusProvider) -> None:
        self.path = path
        self._listener = listener
        self._provider = provider
        self._ino = path.stat().st_ino
        self._limiter = trio.CapacityLimiter(MAX_CONCURRENT_CLIENTS)
        self._conns = Connections(MAX_OPEN_CONNECTIONS)

    @classmethod
    async def open(cls, path: Path, provider: StatusProvider, *,
                   group: str | None = None) -> ControlServer:
        return cls(path, await open_control_listener(path, group=group), provider)

    async def _handler(self, stream: trio.SocketStream) -> None:
        await _handle(stream, self._provider, self._limiter, self._conns)

    async def serve(self) -> None:
        """Serve until cancelled, then remove the socket file (if it is still ours)."""
        try:
            await trio.serve_listeners(self._handler, [self._listener])
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        # A second daemon may have replaced the file: only unlink the inode we bound.
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._ino:
                self.path.unlink()
        await self._listener.aclose()
