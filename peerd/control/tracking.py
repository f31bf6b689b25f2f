"""Each round's metrics out to experiment trackers: an MLflow run in a file store, TensorBoard
event files (``[tracking]``, :mod:`peerd.daemon.config_tracking`).

What a round gives (:class:`TrackedRound`): the daemon's own numbers (``train_loss``,
``val_loss``, ``val_accuracy``, ``examples``, ``cache``, ``version``, ``published``) and, with a
learner of the user's, what its fit and evaluation returned (``fit/NAME``, ``eval/NAME``)
and ``learner_failed`` (1 in a refused round, else 0). The step is the round's number.
Non-finite values (a failed fit's loss) are left out.

Writing never holds up a round: :class:`TrackingWriter` hands each round to one thread of
its own through a bounded queue (a full queue drops the round and counts it), and that
thread does everything slow: importing mlflow (seconds) or tensorboard, opening the run,
writing and flushing. A sink that raises is logged once (and again when it works again),
counted, and tried again next round; the node goes on either way.

The learner's metric names are bounded over the life of the process as in
:mod:`peerd.learn.learner.stats`: each name is a file in the MLflow store and a tag in
TensorBoard, so a learner naming a metric after its round would otherwise grow them
without end. The first :data:`~peerd.learn.learner.check.MAX_METRICS` names of each kind
(fit, eval) are written; later new ones are dropped and counted.

No mlflow or tensorboard import at module level: both are optional (``peerd[tracking]``).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from peerd.control.audit import AuditLearner
from peerd.control.status import TrackingStatus

log = logging.getLogger(__name__)

#: Rounds waiting for the writer thread: a sink slower than the rounds loses the newest
#: ones (counted), never the daemon's memory.
QUEUE_ROUNDS = 64
#: Distinct learner metric names written per kind (fit, eval) over the process's life
#: (peerd.learn.learner.check.MAX_METRICS; not imported: that module imports torch).
MAX_NAMES = 32
#: How long closing waits for the writer thread to write what is queued.
CLOSE_WAIT_S = 10.0
#: MLflow refuses metric keys outside this set; a learner's name may hold anything printable.
_MLFLOW_KEY = re.compile(r"[^\w\-. /]")


@dataclass(frozen=True, slots=True)
class TrackedRound:
    round: int
    ts: float  # seconds since the epoch
    #: The daemon's own numbers of the round (see the module's docstring).
    values: Mapping[str, float]
    #: The learner's part of the round's record (None: the builtin learner).
    learner: AuditLearner | None = None


def tracked_round(*, round_no: int, ts: float, train_loss: float, val_loss: float,
                  val_accuracy: float | None, examples: int, cache: int, version: int,
                  published: bool, learner: AuditLearner | None) -> TrackedRound:
    values = {"train_loss": train_loss, "val_loss": val_loss, "examples": float(examples),
              "cache": float(cache), "version": float(version), "published": float(published)}
    if val_accuracy is not None:
        values["val_accuracy"] = val_accuracy
    return TrackedRound(round=round_no, ts=ts, values=values, learner=learner)


@dataclass
class NameBound:
    """The first ``most`` distinct names seen, per kind, for the life of the process."""

    most: int = MAX_NAMES
    dropped: int = 0
    _admitted: dict[str, set[str]] = field(default_factory=dict)

    def keep(self, kind: str, metrics: Mapping[str, float]) -> dict[str, float]:
        names = self._admitted.setdefault(kind, set())
        kept = {}
        for name, value in metrics.items():
            if name in names or len(names) < self.most:
                names.add(name)
                kept[name] = value
            else:
                self.dropped += 1
        return kept


def scalars(r: TrackedRound, bound: NameBound) -> dict[str, float]:
    """The round as tag -> value, non-finite values left out, learner names bounded."""
    out = dict(r.values)
    lr = r.learner
    if lr is not None:
        for kind, metrics in (("fit", lr.fit_metrics), ("eval", lr.eval_metrics)):
            out.update({f"{kind}/{k}": v for k, v in bound.keep(kind, metrics).items()})
        out["learner_failed"] = 0.0 if lr.failure is None else 1.0
    return {k: float(v) for k, v in out.items() if math.isfinite(v)}


class Sink(Protocol):
    name: str

    def write(self, r: TrackedRound, values: Mapping[str, float]) -> None:
        """Write one round (opening the sink first if needed); raises on failure."""

    def close(self) -> None:
        """Flush and close (best effort: the daemon is stopping)."""


class MlflowSink:
    """One MLflow run per daemon start, in a file store; a metric per tag, its step the
    round. The run is tagged with the node's id and, as params, what the node runs."""

    name = "mlflow"

    def __init__(self, store: Path, experiment: str, *, run_name: str,
                 tags: Mapping[str, str], params: Mapping[str, str]) -> None:
        self.store, self.experiment, self.run_name = store, experiment, run_name
        self.tags, self.params = dict(tags), dict(params)
        self._client: Any = None
        self._run_id: str | None = None

    def _open(self) -> tuple[Any, str]:
        if self._client is not None and self._run_id is not None:
            return self._client, self._run_id
        # MLflow 3 keeps the file store in maintenance mode and refuses it unless asked:
        # it is the store that works offline, which is why peerd uses it.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # MLflow 3 sends usage telemetry to its vendor unless told not to: a node on a LAN
        # must not phone home (nor wait on a network it may not have).
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.store.absolute().as_uri())
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                exp_id = client.create_experiment(self.experiment)
            except Exception:
                found = client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
                exp_id = found.experiment_id
        else:
            exp_id = found.experiment_id
        run = client.create_run(exp_id, run_name=self.run_name, tags=self.tags)
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in self.params.items()])
        self._client, self._run_id = client, run.info.run_id
        return client, run.info.run_id

    def write(self, r: TrackedRound, values: Mapping[str, float]) -> None:
        client, run_id = self._open()  # first: it sets MLflow's environment, then imports it
        from mlflow.entities import Metric  # optional
        ms = int(r.ts * 1000)
        client.log_batch(run_id, metrics=[Metric(_MLFLOW_KEY.sub("_", k), v, ms, r.round)
                                          for k, v in values.items()])

    def close(self) -> None:
        if self._client is not None and self._run_id is not None:
            self._client.set_terminated(self._run_id)


class TensorBoardSink:
    """Event files in one folder (torch's SummaryWriter, which needs the tensorboard
    package): a scalar per tag, its step the round, flushed every round."""

    name = "tensorboard"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._writer: Any = None

    def write(self, r: TrackedRound, values: Mapping[str, float]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.folder))
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=r.round, walltime=r.ts)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


@dataclass
class TrackingCounts:
    """The writer's counts (peerd.control.status.TrackingStatus says what each is)."""

    written: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    dropped_rounds: int = 0
    names_dropped: int = 0
    last_error: str | None = None


class TrackingWriter:
    """The sinks behind one thread. :meth:`submit` (the event loop's) only enqueues."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self.counts = TrackingCounts(failed={s.name: 0 for s in sinks})
        self.bound = NameBound()
        self._queue: queue.Queue[TrackedRound | None] = queue.Queue(QUEUE_ROUNDS)
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()
        self._lock = threading.Lock()

    def submit(self, r: TrackedRound) -> None:
        if self._thread is None:  # started with the first round: nothing runs before it
            self._thread = threading.Thread(target=self._run, name="peerd-tracking",
                                            daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(r)
        except queue.Full:
            with self._lock:
                self.counts.dropped_rounds += 1

    def _run(self) -> None:
        while (r := self._queue.get()) is not None:
            values = scalars(r, self.bound)
            ok = True
            for sink in self.sinks:
                ok = self._write(sink, r, values) and ok
            with self._lock:
                self.counts.written += ok
                self.counts.names_dropped = self.bound.dropped
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001 - stopping: log, never raise
                log.warning("tracking: closing %s failed: %s", sink.name, exc)

    def _write(self, sink: Sink, r: TrackedRound, values: Mapping[str, float]) -> bool:
        try:
            sink.write(r, values)
        except Exception as exc:  # noqa: BLE001 - a sink must never stop the node
            text = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            with self._lock:
                self.counts.failed[sink.name] += 1
                self.counts.last_error = f"{sink.name}: {text}"
            if sink.name not in self._failing:  # once, not every round
                self._failing.add(sink.name)
                log.warning("round %d: tracking to %s failed (counted; tried again each "
                            "round): %s", r.round, sink.name, text)
            return False
        if sink.name in self._failing:
            self._failing.discard(sink.name)
            log.info("round %d: tracking to %s works again", r.round, sink.name)
        return True

    def snapshot(self) -> TrackingStatus:
        """The status's ``tracking`` block (cheap: the event loop calls it)."""
        with self._lock:
            c = self.counts
            return TrackingStatus(sinks=tuple(s.name for s in self.sinks), written=c.written,
                                  failed=dict(c.failed), dropped_rounds=c.dropped_rounds,
                                  names_dropped=c.names_dropped, last_error=c.last_error)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Write what is queued (up to ``wait_s``), then close the sinks."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=wait_s)
        except queue.Full:
            return  # the thread is stuck in a sink: it is a daemon thread, let it be
        self._thread.join(wait_s)
        self._thread = None
        c = self.snapshot()
        if any(c.failed.values()) or c.dropped_rounds or c.names_dropped:
            # Also in the status while it runs; this line outlives the process.
            log.warning("tracking: %d rounds written; failed by sink %s; %d rounds dropped "
                        "(queue full); %d learner metric values dropped (past %d names); "
                        "last error: %s", c.written, c.failed, c.dropped_rounds,
                        c.names_dropped, MAX_NAMES, c.last_error)
