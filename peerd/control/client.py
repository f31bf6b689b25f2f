"""The control API's client: what ``peerd status``/``peers``/``flags``/``audit`` send over the
Unix socket and how they read the answer (protocol: :mod:`peerd.control.server`).

Synchronous stdlib code, so the CLI stays light: :func:`request` returns the raw result,
:func:`request_status` and the others decode it into the typed values of
:mod:`peerd.control.status`. Also owns what both ends share: the API version and
:class:`ControlError`. It must not import the server (the server re-exports these names) or
the daemon.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from peerd.control.status import (
    Flags,
    PeerRow,
    Status,
    StatusError,
    flags_from_json,
    from_json,
    peers_from_json,
)

T = TypeVar("T")

#: The control API's version: a request names it, an answer repeats it.
API_VERSION = 1
#: Largest response the client reads: status with C cache entries and a few hundred peers is
#: tens of KB; a confused server (or another program on the path) must not exhaust the CLI.
MAX_RESPONSE_LEN = 16 * 1024**2
#: Default client timeout: the daemon answers from memory, so seconds mean it is stuck.
DEFAULT_TIMEOUT_S = 5.0
#: First pause before the client tries again when the backlog is full (EAGAIN); it doubles
#: up to the cap, within the client's timeout.
CONNECT_RETRY_S = 0.01
CONNECT_RETRY_MAX_S = 0.2
#: Deepest nesting of JSON arrays and objects either end parses. Threat: Python's json module
#: recurses once per level, so a request under MAX_REQUEST_LEN made of ~1,000 "[" raised an
#: uncaught RecursionError in the daemon's handler (a traceback, the connection closed with
#: no answer), and the same holds for a response the CLI reads. Real messages nest about 5
#: deep (status -> cache -> row -> map).
MAX_CONTROL_JSON_DEPTH = 32
#: A JSON string (escapes included): its brackets are text, not nesting.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def json_too_deep(raw: bytes, limit: int = MAX_CONTROL_JSON_DEPTH) -> bool:
    """Whether ``raw`` nests arrays and objects deeper than ``limit``: a pre-scan before
    :func:`json.loads`, linear and without recursion. Only the depth is judged (brackets
    outside strings); whether it is valid JSON is the parser's to say."""
    depth = 0
    for m in _BRACKET.finditer(_JSON_STRING.sub(b'""', raw)):
        if m.group() in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


class ControlError(Exception):
    """A control request failed; ``code`` is machine-readable, the message is for humans."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _connect(sock: socket.socket, socket_path: Path, timeout: float) -> None:
    # A socket with a timeout is non-blocking inside, and on a Unix socket whose backlog is
    # full connect() fails at once with EAGAIN instead of waiting: the daemon is busy
    # accepting a burst of connections, so try again (briefly) within the timeout.
    deadline = time.monotonic() + timeout
    pause = CONNECT_RETRY_S
    while True:
        try:
            sock.connect(str(socket_path))
            return
        except BlockingIOError:
            if time.monotonic() + pause >= deadline:
                raise TimeoutError from None
            time.sleep(pause)
            pause = min(2 * pause, CONNECT_RETRY_MAX_S)


def request(socket_path: Path, method: str, timeout: float = DEFAULT_TIMEOUT_S,
            params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ask the daemon; the ``result`` dict, or :class:`ControlError` with a clear message.
    ``params``: the method's arguments, sent beside ``api`` and ``method``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            _connect(sock, socket_path, timeout)
        except FileNotFoundError:
            raise ControlError("not_running",
                               f"peerd is not running? no socket at {socket_path}") from None
        except ConnectionRefusedError:
            if not _is_socket(socket_path):  # a file someone put there, or a wrong path
                raise ControlError("not_a_socket", f"{socket_path} is not a socket: not a "
                                   "peerd control socket (check --socket / [node] socket)"
                                   ) from None
            raise ControlError("not_running", f"peerd is not running? {socket_path} exists but "
                               "nobody listens (stale socket from a crash)") from None
        except PermissionError:
            raise ControlError("permission_denied",
                               f"permission denied on {socket_path}: run as the daemon's user "
                               "or root, or join the socket's group ([node] socket_group)"
                               ) from None
        data = bytearray()
        ask = {**(params or {}), "api": API_VERSION, "method": method}
        sock.sendall(json.dumps(ask).encode() + b"\n")
        while len(data) <= MAX_RESPONSE_LEN:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        raise ControlError("timeout", f"no answer from peerd at {socket_path} within "
                                      f"{timeout:g} s; is the daemon stuck?") from None
    except OSError as exc:
        if isinstance(exc, ControlError):
            raise
        code = "not_running" if exc.errno in (errno.ECONNRESET, errno.EPIPE) else "io_error"
        raise ControlError(code, f"talking to peerd at {socket_path}: {exc.strerror}") from None
    finally:
        sock.close()
    if len(data) > MAX_RESPONSE_LEN:
        raise ControlError("bad_response", f"response from {socket_path} is over "
                                           f"{MAX_RESPONSE_LEN} bytes")
    if not data:
        raise ControlError("bad_response", f"peerd at {socket_path} closed the connection "
                                           "without answering; see its log")
    if json_too_deep(bytes(data)):
        raise ControlError("bad_response", f"response from {socket_path} nests deeper than "
                                           f"{MAX_CONTROL_JSON_DEPTH} levels")
    try:
        response = json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError):
        raise ControlError("bad_response", f"{socket_path} did not answer with JSON; "
                                           "is it a peerd control socket?") from None
    if not isinstance(response, dict) or not isinstance(response.get("ok"), bool):
        raise ControlError("bad_response", f"malformed response from {socket_path}")
    if not response["ok"]:
        err = response.get("error")
        err = err if isinstance(err, dict) else {}
        raise ControlError(str(err.get("code", "error")), str(err.get("message", "daemon error")))
    result = response.get("result")
    if not isinstance(result, dict):
        raise ControlError("bad_response", f"response from {socket_path} has no result object")
    return result


def decode_result(socket_path: Path, decode: Callable[[dict[str, Any]], T],
                  result: dict[str, Any]) -> T:
    """``decode(result)`` of a :func:`request` answer; a wrong shape is a ``bad_response``
    :class:`ControlError` (a daemon of another release, or not a peerd socket)."""
    try:
        return decode(result)
    except StatusError as exc:
        raise ControlError("bad_response", f"the daemon at {socket_path} answered a status "
                                           f"this CLI cannot read ({exc}); use the peerd CLI "
                                           "of the same release") from None


def request_status(socket_path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> Status:
    """Ask the daemon for its status, decoded; :class:`ControlError` as :func:`request`."""
    return decode_result(socket_path, from_json, request(socket_path, "status", timeout))


def request_peers(socket_path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[PeerRow, ...]:
    """Ask the daemon for its peers, decoded; :class:`ControlError` as :func:`request`."""
    return decode_result(socket_path, peers_from_json, request(socket_path, "peers", timeout))


def request_flags(socket_path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> Flags:
    """Ask the daemon for its flagged origins; :class:`ControlError` as :func:`request`."""
    return decode_result(socket_path, flags_from_json, request(socket_path, "flags", timeout))


def request_clear_flag(socket_path: Path, origin: str,
                       timeout: float = DEFAULT_TIMEOUT_S) -> Flags:
    """Clear ``origin``'s flag (``not_flagged`` :class:`ControlError` if it had none)."""
    return decode_result(socket_path, flags_from_json,
                         request(socket_path, "clear_flag", timeout, {"origin": origin}))
