"""The daemon's side of a learner worker: the user's code in a process of its own.

:class:`WorkerLearner` is a :class:`~peerd.learn.learner.contract.Learner` to the round: its
``fit`` and ``evaluate`` run the user's learner in a child process
(:mod:`peerd.learn.learner.child`, started as ``python -m``, never forked from the daemon and
never fed a pickle), so whatever it does — raise, hang, leak, segfault, run out of GPU
memory — fails one round with a named :class:`Refusal` and the daemon goes on:

* an exception in ``fit``/``evaluate`` → ``raised`` (its type and first line); the worker
  lives on;
* no answer within ``timeout_s`` → ``timeout``: the worker gets SIGTERM, then SIGKILL after
  ``grace_s``, and a fresh one starts at the next call;
* the worker died (a signal, an exit, a frame that is not the protocol) → ``crashed``; the
  next start waits an exponential backoff (``backoff_base_s`` doubling per crash in a row,
  capped at ``backoff_cap_s``); calls meanwhile fail at once, saying when it retries. A fit
  that succeeds resets the count.

Parameters travel in two buffer files laid out by the schema (:mod:`peerd.learn.learner.wire`):
x̄ is written into the input buffer (one copy), the result read from the output buffer,
which the round copies into the model (:mod:`peerd.learn.trainer`).

Calls are made from one thread at a time (the round's); :meth:`kill` may come from any.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from peerd.learn.learner.check import FleetSchema, bounded
from peerd.learn.learner.contract import (
    EvalResult,
    FitConfig,
    FitResult,
    LearnerContext,
    LearnerError,
    LearnerKind,
    Params,
    Refusal,
)
from peerd.learn.learner.wire import (
    Buffer,
    DeadlineError,
    PeerGoneError,
    WireError,
    create_buffer,
    layout,
    receive,
    schema_to_json,
    send,
    write_into,
)

log = logging.getLogger(__name__)

#: After SIGTERM, how long a worker may take to exit before SIGKILL.
GRACE_S = 5.0
#: The first restart after a crash waits this long, doubling per crash in a row, up to the cap.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 300.0
CHILD_MODULE = "peerd.learn.learner.child"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker runs: the learner, its context, the schema and where the buffers live."""

    kind: LearnerKind
    entry: str
    context: LearnerContext
    schema: FleetSchema
    #: A private directory for the two buffer files (the daemon's: under its state dir).
    buffer_dir: Path
    timeout_s: float = 600.0
    #: How long starting may take (the interpreter, torch and the user's imports and
    #: factory) before it counts as a crash: not timeout_s, which bounds one fit.
    start_timeout_s: float = 120.0
    torch_threads: int = 1
    #: The most examples peers accept in an entry ([validation] max_examples).
    max_examples: int | None = None
    #: The child's interpreter (``[learner] python``); None: the daemon's own.
    python: str | None = None
    #: Extra environment for the child (tests); the daemon's own is inherited.
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Backoff:
    """Crashes in a row and when the next start may be tried (monotonic seconds)."""

    base_s: float = BACKOFF_BASE_S
    cap_s: float = BACKOFF_CAP_S
    crashes: int = 0
    not_before: float = 0.0

    def crashed(self, now: float) -> float:
        self.crashes += 1
        delay = min(self.base_s * 2.0 ** (self.crashes - 1), self.cap_s)
        self.not_before = now + delay
        return delay

    def reset(self) -> None:
        self.crashes, self.not_before = 0, 0.0


def _fit_config_json(config: FitConfig) -> dict[str, Any]:
    return {"round": config.round, "rho": config.rho, "steps": config.steps,
            "seed": config.seed, "device": config.device, "batch_size": config.batch_size,
            "lr": config.lr, "run_config": dict(config.run_config)}


def _exit_text(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class WorkerLearner:
    """A :class:`~peerd.learn.learner.contract.Learner` whose calls run in a worker process."""

    def __init__(self, spec: WorkerSpec, *, grace_s: float = GRACE_S,
                 backoff: Backoff | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if spec.kind not in (LearnerKind.PYTHON, LearnerKind.FLOWER):
            raise ValueError(f"a worker runs python and flower learners, not {spec.kind}")
        self.spec, self.grace_s, self.clock = spec, grace_s, clock
        self.backoff = backoff if backoff is not None else Backoff()
        self.names = list(spec.schema)
        _, size = layout(spec.schema)
        spec.buffer_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tag = f"learner-{os.getpid()}-{id(self):x}"
        self.paths = {"in": spec.buffer_dir / f"{tag}.in", "out": spec.buffer_dir / f"{tag}.out"}
        for path in self.paths.values():
            create_buffer(path, size)
        # Mapped once for the worker's life (a mapping per call cost a fault per page): x̄
        # is written into the input, the result read from the output through a private
        # mapping reset before each read (peerd.learn.learner.wire.Buffer).
        self._in: Buffer | None = Buffer(self.paths["in"], spec.schema, shared=True)
        self._out: Buffer | None = Buffer(self.paths["out"], spec.schema, shared=False)
        self._proc: subprocess.Popen[bytes] | None = None
        self._fds: tuple[int, int] | None = None  # (requests, answers), the daemon's ends
        self._last_out: Params | None = None
        self._lock = threading.RLock()  # kill() from the loop thread vs a call's restart
        #: Workers started so far (the first included), and what the last crash was.
        self.starts = 0
        self.last_crash: str | None = None
        self.closed = False

    # ------------------------------------------------------------------ the contract
    def fit(self, params: Params, anchor: Params, config: FitConfig) -> FitResult:
        """``params`` (= ``anchor`` = x̄) into the input buffer, the worker's ``fit``; the
        result's params are a view of the output buffer, valid until the next call (what
        is written into it stays in this process and is dropped by the next call)."""
        buffers = self._buffers()
        write_into(buffers[0].tensors, params, self.names)
        self._last_out = None
        answer = self._call({"op": "fit", "config": _fit_config_json(config)})
        out = buffers[1].reset()
        self._last_out = out
        self.backoff.reset()  # it ran a whole fit: the crashes are behind it
        return FitResult(params=out, num_examples=answer.get("num_examples"),  # type: ignore[arg-type]
                         metrics=answer.get("metrics"))  # type: ignore[arg-type]

    def evaluate(self, params: Params, config: FitConfig) -> EvalResult:
        """The worker's ``evaluate``; the last fit's own result is read where the worker
        wrote it (no copy), anything else goes through the input buffer."""
        if params is self._last_out:
            which = "out"
        else:
            write_into(self._buffers()[0].tensors, params, self.names)
            which = "in"
        answer = self._call({"op": "evaluate", "buffer": which,
                             "config": _fit_config_json(config)})
        return EvalResult(loss=answer.get("loss"), num_examples=answer.get("num_examples"),  # type: ignore[arg-type]
                          metrics=answer.get("metrics"))  # type: ignore[arg-type]

    def _buffers(self) -> tuple[Buffer, Buffer]:
        if self._in is None or self._out is None:
            raise LearnerError(Refusal.CRASHED, "the worker is closed")
        return self._in, self._out

    # ------------------------------------------------------------------ the process
    @property
    def pid(self) -> int | None:
        p = self._proc
        return None if p is None or p.poll() is not None else p.pid

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    def start(self) -> None:
        """Start the worker now (the daemon's first start, at start-up); a failure is a
        :class:`LearnerError` (``crashed``) and counts as a crash."""
        with self._lock:
            if self._proc is None:
                self._spawn()

    def _ensure_started(self) -> None:
        with self._lock:
            if self.closed:
                raise LearnerError(Refusal.CRASHED, "the worker is closed")
            if self._proc is not None:
                return
            wait = self.backoff.not_before - self.clock()
            if wait > 0:
                raise LearnerError(
                    Refusal.CRASHED,
                    f"the worker crashed {self.backoff.crashes} time"
                    f"{'s' if self.backoff.crashes != 1 else ''} in a row; "
                    f"restarting in {wait:.1f} s")
            self._spawn()

    def _spawn(self) -> None:
        spec = self.spec
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        env = dict(os.environ)
        if spec.python is None:
            # The entry resolves in the worker as it would in the daemon: the same import path.
            env["PYTHONPATH"] = os.pathsep.join(
                [p for p in sys.path if p] + [x for x in [env.get("PYTHONPATH")] if x])
        # else another environment: its own site-packages (and its own peerd), never ours.
        env.update(spec.env)
        try:
            proc = subprocess.Popen(  # noqa: S603 - our own module, by a configured python
                [spec.python or sys.executable, "-m", CHILD_MODULE, str(req_r), str(ans_w)],
                pass_fds=(req_r, ans_w), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        except OSError as exc:
            for fd in (req_r, req_w, ans_r, ans_w):
                os.close(fd)
            self._crashed(f"could not start: {exc.strerror or exc}")
        os.close(req_r)
        os.close(ans_w)
        self._proc, self._fds = proc, (req_w, ans_r)
        self.starts += 1
        ctx = spec.context
        init = {"op": "init", "kind": spec.kind.value, "entry": spec.entry,
                "schema": schema_to_json(spec.schema),
                "in": str(self.paths["in"]), "out": str(self.paths["out"]),
                "max_examples": spec.max_examples, "torch_threads": spec.torch_threads,
                "context": {"node_id": ctx.node_id, "device": ctx.device,
                            "node_config": dict(ctx.node_config),
                            "run_config": dict(ctx.run_config)}}
        try:
            send(req_w, init)
            answer = receive(ans_r, deadline=time.monotonic() + spec.start_timeout_s)
        except DeadlineError:
            self._stop_process()
            self._crashed(f"did not start within {spec.start_timeout_s:g} s")
        except WireError:
            code = self._stop_process()
            self._crashed(f"{_exit_text(code)} while starting")
        if not answer.get("ok"):
            self._stop_process()
            detail = bounded(str(answer.get("detail", "")))
            self._crashed(f"could not build the learner {spec.entry}: {detail}")
        log.info("learner worker %d started (%s %s)", proc.pid, spec.kind.value, spec.entry)

    def _crashed(self, what: str) -> NoReturn:
        """Count a crash, schedule the restart, raise ``crashed``."""
        self.last_crash = what
        delay = self.backoff.crashed(self.clock())
        raise LearnerError(Refusal.CRASHED,
                           f"the worker {what}; restarting in {delay:.1f} s at the earliest")

    def _call(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self._ensure_started()
        assert self._fds is not None
        req_w, ans_r = self._fds
        timeout = self.spec.timeout_s
        try:
            send(req_w, request)
            answer = receive(ans_r, deadline=time.monotonic() + timeout)
        except DeadlineError:
            self._stop_process()
            raise LearnerError(Refusal.TIMEOUT,
                               f"no answer within timeout_s = {timeout:g} s: the worker was "
                               "stopped (a fresh one starts next round)") from None
        except PeerGoneError:
            code = self._stop_process()
            self._crashed(_exit_text(code))
        except WireError as exc:
            self._stop_process()
            raise LearnerError(Refusal.MALFORMED,
                               f"the worker broke the protocol ({exc}); it was stopped") from None
        if answer.get("ok") is True:
            return answer
        try:
            reason = Refusal(str(answer.get("reason")))
        except ValueError:
            reason = Refusal.MALFORMED
        raise LearnerError(reason, bounded(str(answer.get("detail", ""))))

    def _stop_process(self) -> int | None:
        """Stop the worker (SIGTERM, SIGKILL after the grace), close the pipes; its exit code
        (None if it could not be reaped)."""
        with self._lock:
            proc, fds = self._proc, self._fds
            self._proc, self._fds = None, None
        if fds is not None:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if proc is None:
            return None
        try:
            return proc.wait(timeout=0.2)  # it died already (a crash): no signal needed
        except subprocess.TimeoutExpired:
            pass
        proc.terminate()
        try:
            return proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                return proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                return None

    def kill(self) -> None:
        """SIGKILL the worker now (the daemon is stopping): a call waiting on it returns at
        once with ``crashed``. Safe from any thread."""
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def close(self) -> None:
        """Stop the worker and remove the buffers; later calls fail with ``crashed``."""
        if self.closed:
            return
        with self._lock:
            self.closed = True
            fds = self._fds
        if fds is not None:
            with contextlib.suppress(WireError):
                send(fds[0], {"op": "stop"})
        self._stop_process()
        self._in, self._out, self._last_out = None, None, None
        for path in self.paths.values():
            path.unlink(missing_ok=True)
