"""``[learner] kind = "external"``: what the daemon and the user's training process share.

The training process (:mod:`peerd.client`) attaches to the daemon over a Unix socket in the
state directory (:func:`learner_socket`; bound as the control socket is: 0600, or 0660 to
``[node] socket_group``). Requests and answers are the frames of
:mod:`peerd.learn.learner.wire` (4-byte length, a JSON object, never a pickle):

* ``{"op": "hello", "api": 1}`` → the fleet's schema, the node, ρ and the settings;
* ``{"op": "blend"}`` with a buffer → the daemon writes x̄ (the blend of its cache as of
  now) into it and answers α;
* ``{"op": "publish", "schema", "num_examples", "metrics"}`` with a buffer holding the
  trained model → checked as a worker's ``FitResult`` is (:mod:`peerd.learn.learner.check`),
  then the daemon's next round signs and gossips it; the answer says which version.

**Buffers** are memfds the client creates and passes with ``SCM_RIGHTS``, laid out as
:func:`peerd.learn.learner.wire.layout` lays out the worker's buffer files (no second
layout). The client allocates their pages (charged to its own memory, not the daemon's) and
seals them before sending: a blend buffer against shrinking and growing (the daemon writes
into its mapping, which a shrunk file would make fault), a publish buffer against writing too
(the daemon checks the values and then copies them: nothing may change them in between).
The model crosses the socket with one copy: the daemon writes x̄ into the blend buffer,
which the client maps copy-on-write; the client writes its model into the publish buffer,
which the daemon maps and reads.

Linux only (memfd, sealing, ``/proc/self/fd``). Imports torch and the standard library only.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from peerd.learn.learner.check import (
    FleetSchema,
    check_examples,
    check_fit,
    check_metrics,
    check_schema,
)
from peerd.learn.learner.contract import FitResult, LearnerError, Refusal
from peerd.learn.learner.wire import Buffer, WireError, layout, schema_from_json

#: The socket's name in the state directory.
SOCKET_NAME = "learner.sock"
#: The external learner API's version: ``hello`` names it, the daemon refuses another.
API_VERSION = 1
#: Clients attached at once. Threat: every connection holds a file descriptor and a task in
#: the daemon for as long as it stays open (an attached training loop stays for hours), so a
#: local process opening connections in a loop must meet a cap, not exhaust the daemon's
#: descriptors; one training process is the normal case, a few (a notebook beside a script,
#: a reconnect before the kernel closed the old one) are allowed.
MAX_CLIENTS = 4
#: File descriptors a frame may carry. Threat: descriptors passed with SCM_RIGHTS become the
#: daemon's open files on receipt; more than one per frame are never needed, and the kernel
#: closes what does not fit the receive buffer sized for one.
MAX_FDS = 1
#: Once a frame's first byte arrived, the rest must arrive within this. Threat: a client that
#: sends half a frame and stalls would hold its connection (and a buffer) forever; between
#: frames a client may be silent as long as it trains.
FRAME_TIMEOUT_S = 10.0
#: Publishes waiting for their round at once: one. Threat: each holds a model-sized mapping
#: until its round signs it; a second publish while one waits is answered ``busy``.
MAX_PENDING_PUBLISHES = 1
#: How long a publish waits for the round that signs it (the round loop is woken at once;
#: a round already running is waited for) before the client is told it failed.
PUBLISH_WAIT_S = 600.0

#: The seals a blend buffer must carry, and a publish buffer.
BLEND_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
PUBLISH_SEALS = BLEND_SEALS | fcntl.F_SEAL_WRITE


class BufferError(ValueError):
    """A passed buffer is not a sealed memfd of the schema's size."""


def learner_socket(state_dir: Path) -> Path:
    """The external learner's socket of the daemon whose state directory is ``state_dir``."""
    return Path(state_dir) / SOCKET_NAME


def fd_path(fd: int) -> Path:
    """A path that opens the file behind ``fd`` (how torch maps a memfd: by name)."""
    return Path(f"/proc/self/fd/{fd}")


def new_buffer(size: int, name: str = "peerd-learner") -> int:
    """A memfd of ``size`` bytes whose pages are allocated now, by the caller (sealable)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def seal(fd: int, seals: int) -> None:
    """Add ``seals`` to the memfd (F_SEAL_WRITE needs every shared writable mapping gone)."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)


def check_buffer(fd: int, schema: FleetSchema, seals: int) -> None:
    """``fd`` is a regular file (a memfd) of the schema's layout size carrying ``seals``."""
    _, size = layout(schema)
    try:
        st = os.fstat(fd)
        have = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise BufferError(f"the buffer is not a sealable memfd ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise BufferError("the buffer is not a memfd")
    if have & seals != seals:
        raise BufferError("the buffer is not sealed (F_SEAL_SHRINK, F_SEAL_GROW"
                          + (", F_SEAL_WRITE)" if seals & fcntl.F_SEAL_WRITE else ")"))
    if st.st_size != size:
        raise BufferError(f"the buffer holds {st.st_size} bytes, the schema needs {size}")


def map_fd(fd: int, schema: FleetSchema, *, shared: bool) -> dict[str, torch.Tensor]:
    """The buffer behind ``fd`` as the schema's tensors (no copy; see wire.Buffer). Mapped
    for this one call: each blend or publish brings a buffer of its own. The tensors keep
    the mapping alive (torch.frombuffer holds it) after the Buffer object is gone."""
    return Buffer(fd_path(fd), schema, shared=shared).tensors


def accept_publish(request: Mapping[str, Any], fd: int | None, schema: FleetSchema, *,
                   max_examples: int | None) -> FitResult:
    """A ``publish`` request as the checked :class:`FitResult` it carries, its tensors a
    private mapping of the sealed buffer; else :class:`LearnerError` naming why, as a
    worker's result is refused. Cheap checks first: the declared schema, the example count
    and the metrics before a pass over every parameter."""
    try:
        declared = schema_from_json(request.get("schema"))
    except WireError as exc:
        raise LearnerError(Refusal.MALFORMED, f"publish: {exc}") from None
    check_schema(declared, schema)
    n = check_examples(request.get("num_examples"), most=max_examples)
    metrics = check_metrics(request.get("metrics", {}))
    if fd is None:
        raise LearnerError(Refusal.MALFORMED, "publish came without its buffer")
    try:
        check_buffer(fd, schema, PUBLISH_SEALS)
    except BufferError as exc:
        raise LearnerError(Refusal.MALFORMED, str(exc)) from None
    params = map_fd(fd, schema, shared=False)
    return check_fit(FitResult(params=params, num_examples=n, metrics=metrics), schema,
                     max_examples=max_examples)
