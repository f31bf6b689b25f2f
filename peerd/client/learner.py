"""The training process's side of ``[learner] kind = "external"``: :class:`ExternalLearner`.

Synchronous, for any training loop (a script, a notebook, a job on a GPU box)::

    with peerd.client.connect("/var/lib/peerd") as peer:
        for _ in range(rounds):
            model.load_state_dict(peer.blend())    # x̄: the blend of the daemon's cache now
            ...train a few steps, any optimizer (Proximal(model, anchor, peer.rho))...
            peer.publish(model.state_dict(), num_examples=n, metrics={"train_loss": loss})

The model crosses the socket in memfd buffers (protocol and layout:
:mod:`peerd.learn.learner.external`): ``blend`` returns tensors mapped copy-on-write from
the buffer the daemon wrote x̄ into (no copy here), ``publish`` copies the state dict once
into a sealed buffer the daemon reads. The daemon signs and gossips; the node's key never
leaves it.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from peerd.client.errors import (
    BusyError,
    ClientError,
    DaemonGoneError,
    NotRunningError,
    PermissionDeniedError,
    PublishRefusedError,
    WrongKindError,
)
from peerd.control.client import ControlError, request_status
from peerd.daemon.config import default_socket
from peerd.learn.learner.check import FleetSchema, schema_of
from peerd.learn.learner.external import (
    API_VERSION,
    BLEND_SEALS,
    PUBLISH_SEALS,
    PUBLISH_WAIT_S,
    learner_socket,
    map_fd,
    new_buffer,
    seal,
)
from peerd.learn.learner.wire import (
    HEADER_LEN,
    WireError,
    frame,
    frame_length,
    layout,
    parse,
    schema_from_json,
    schema_to_json,
    write_into,
)

#: How long connecting, ``hello`` and ``blend`` may take (the blend is one pass over the
#: cache); a publish waits for the round that signs it, up to the daemon's own bound.
CALL_TIMEOUT_S = 120.0
PUBLISH_TIMEOUT_S = PUBLISH_WAIT_S + 60.0


@dataclass(frozen=True, slots=True)
class Published:
    """What the round that carried a publish did with it."""

    #: The daemon's round that took it.
    round: int
    #: Signed and gossiped as ``version``; False: it moved no more than ``[learning]
    #: epsilon`` since the last published entry (the daemon keeps it as its model).
    published: bool
    version: int | None


class ExternalLearner:
    """One attachment to a daemon's learner socket (use :func:`connect`)."""

    def __init__(self, sock: socket.socket, path: Path, hello: Mapping[str, Any]) -> None:
        self._sock, self.path = sock, path
        try:
            #: The fleet's schema: state_dict names → shape and dtype, in state_dict order.
            self.schema: FleetSchema = schema_from_json(hello["schema"])
            self.node_id = str(hello["node_id"])
            #: ``[learner] device``, resolved by the daemon ("cpu", "cuda:0", …).
            self.device = str(hello["device"])
            #: ρ of the proximal term (``[learning] rho``: FedProx's μ), the step budget K
            #: and the built-in learner's lr and batch size (yours to use or ignore).
            self.rho = float(hello["rho"])
            self.steps = int(hello["steps"])
            self.lr = float(hello["lr"])
            self.batch_size = int(hello["batch_size"])
            self.max_examples: int | None = hello.get("max_examples")
            #: ``[learner.run_config]`` and ``[learner.node_config]``.
            self.run_config: dict[str, Any] = dict(hello.get("run_config") or {})
            self.node_config: dict[str, Any] = dict(hello.get("node_config") or {})
        except (KeyError, TypeError, ValueError, WireError) as exc:
            sock.close()
            raise ClientError(f"{path}: a hello this client cannot read ({exc}); use "
                              "peerd.client of the daemon's release", "bad_response") from None
        self._names = list(self.schema)
        self._size = layout(self.schema)[1]
        #: α of the last :meth:`blend`, by origin (own first).
        self.last_alpha: dict[str, float] = {}

    # ------------------------------------------------------------------ the calls
    def blend(self) -> dict[str, torch.Tensor]:
        """x̄ as of now: the daemon's own model blended with its cache exactly as its
        weight-mode round would (α, τ_max and C applied now), as CPU tensors by
        ``state_dict`` name, mapped copy-on-write (writing them changes nothing elsewhere)."""
        fd = new_buffer(self._size)
        try:
            seal(fd, BLEND_SEALS)
            answer = self._call({"op": "blend"}, fd, CALL_TIMEOUT_S)
            params = map_fd(fd, self.schema, shared=False)
        finally:
            os.close(fd)
        alpha = answer.get("alpha")
        self.last_alpha = dict(alpha) if isinstance(alpha, dict) else {}
        return params

    def publish(self, state_dict: Mapping[str, torch.Tensor], num_examples: int,
                metrics: Mapping[str, float] | None = None) -> Published:
        """Hand the trained model to the daemon, which checks it as a worker learner's result
        (schema, finite values, the example count, at most 32 metrics) and signs and
        gossips it in a round it runs at once. Tensors may be on any device (copied once to
        the buffer); 0-d tensors in ``metrics`` are read as numbers.
        :class:`PublishRefusedError` names the reason when the daemon refuses it."""
        tensors = {}
        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"state_dict[{name!r}] is a {type(t).__name__}, not a tensor")
            tensors[name] = t.detach()
        declared = schema_of(tensors)
        request = {"op": "publish", "schema": schema_to_json(declared),
                   "num_examples": _count(num_examples), "metrics": _numbers(metrics or {})}
        fd = None
        if declared == dict(self.schema):
            fd = new_buffer(self._size)
        # else: sent without a buffer; the daemon refuses it by name (schema) and counts it.
        try:
            if fd is not None:
                buffer = map_fd(fd, self.schema, shared=True)
                write_into(buffer, tensors, self._names)  # the one copy
                del buffer  # sealing against writes needs every writable mapping gone
                seal(fd, PUBLISH_SEALS)
            answer = self._call(request, fd, PUBLISH_TIMEOUT_S)
        finally:
            if fd is not None:
                os.close(fd)
        return Published(round=int(answer["round"]), published=bool(answer["published"]),
                         version=answer.get("version"))

    # ------------------------------------------------------------------ plumbing
    def _call(self, message: Mapping[str, Any], fd: int | None,
              timeout: float) -> dict[str, Any]:
        self._sock.settimeout(timeout)
        try:
            _send(self._sock, message, fd)
            answer = _receive(self._sock)
        except TimeoutError:
            raise ClientError(f"no answer from the daemon at {self.path} within {timeout:g} s",
                              "timeout") from None
        except (ConnectionResetError, BrokenPipeError):
            raise DaemonGoneError(f"the daemon at {self.path} closed the connection (it "
                                  "stopped?); connect again once it runs") from None
        return _checked(answer, self.path)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> ExternalLearner:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def connect(where: str | os.PathLike[str], *, timeout: float = CALL_TIMEOUT_S) -> ExternalLearner:
    """Attach to the daemon whose state directory (or learner socket) is ``where``.

    :class:`NotRunningError` if none listens, :class:`WrongKindError` if the daemon on that
    state directory runs another ``[learner] kind``, :class:`PermissionDeniedError` for
    another user's socket, :class:`BusyError` when it serves as many clients as it may."""
    where = Path(where)
    try:
        state_dir = where if where.is_dir() else None
    except PermissionError:
        raise _denied(where) from None
    path = learner_socket(where) if state_dir is not None else where
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        # A daemon turning us away may answer and close before our hello: read its answer.
        with contextlib.suppress(BrokenPipeError):
            _send(sock, {"op": "hello", "api": API_VERSION}, None)
        hello = _checked(_receive(sock), path)
    except FileNotFoundError:
        sock.close()
        raise _absent(path, state_dir) from None
    except ConnectionRefusedError:
        sock.close()
        raise NotRunningError(f"no daemon listens on {path} (a socket left by a crash)") from None
    except PermissionError:
        sock.close()
        raise _denied(path) from None
    except TimeoutError:
        sock.close()
        raise ClientError(f"no answer from {path} within {timeout:g} s", "timeout") from None
    except (ConnectionResetError, BrokenPipeError):
        sock.close()
        raise DaemonGoneError(f"the daemon at {path} closed the connection before answering "
                              "(it is stopping?)") from None
    except BaseException:
        sock.close()
        raise
    return ExternalLearner(sock, path, hello)


def _denied(path: Path) -> PermissionDeniedError:
    return PermissionDeniedError(f"permission denied on {path}: run as the daemon's user, or "
                                 "join its [node] socket_group")


def _absent(path: Path, state_dir: Path | None) -> ClientError:
    """No learner socket: a daemon of another kind, or none at all (its control socket says)."""
    if state_dir is not None:
        try:
            status = request_status(default_socket(state_dir), timeout=5.0)
        except ControlError:
            pass
        else:
            return WrongKindError(
                f"peerd runs on {state_dir} with [learner] kind = \"{status.config.learner}\" "
                f"(mode {status.config.mode}); an external learner needs [learner] kind = "
                "\"external\" in weight mode")
    return NotRunningError(f"peerd is not running? no learner socket at {path} (a daemon with "
                           "[learner] kind = \"external\" makes it)")


def _checked(answer: dict[str, Any], path: Path) -> dict[str, Any]:
    if answer.get("ok") is True:
        return answer
    err = answer.get("error")
    err = err if isinstance(err, dict) else {}
    code, message = str(err.get("code", "error")), str(err.get("message", "daemon error"))
    if code == "refused":
        raise PublishRefusedError(str(err.get("reason", "malformed")), message)
    if code == "busy":
        raise BusyError(f"{path}: {message}")
    raise ClientError(f"{path}: {message}", code)


def _count(n: object) -> object:
    """An integer-like example count as an int (numpy, torch); anything else as is: the
    daemon judges it (and refuses a float or a negative count by name)."""
    if isinstance(n, torch.Tensor) and n.numel() == 1:
        return n.item()
    if not isinstance(n, bool | int | float) and hasattr(n, "__index__"):
        return int(n.__index__())
    return n


def _numbers(metrics: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        elif hasattr(value, "item") and not isinstance(value, bool | int | float):
            value = value.item()  # a numpy scalar
        # NaN and ±Inf travel as such (JSON as Python writes it): the daemon refuses them.
        out[str(name)] = value
    return out


def _send(sock: socket.socket, message: Mapping[str, Any], fd: int | None) -> None:
    data = frame(message)
    if fd is None:
        sock.sendall(data)
        return
    fds = array.array("i", [fd])
    sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
    if sent < len(data):
        sock.sendall(data[sent:])


def _exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise DaemonGoneError("the daemon closed the connection (it stopped?); connect "
                                  "again once it runs")
        buf += chunk
    return bytes(buf)


def _receive(sock: socket.socket) -> dict[str, Any]:
    try:
        return parse(_exact(sock, frame_length(_exact(sock, HEADER_LEN))))
    except WireError as exc:
        raise ClientError(f"a broken answer from the daemon: {exc}", "bad_response") from None
