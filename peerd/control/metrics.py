"""Optional Prometheus endpoint (``[network] metrics_listen``), fed from the typed status.

The daemon already builds one :class:`~peerd.control.status.Status` for ``peerd status``; the
metrics are derived from the same value, so the two views can never disagree and the round
loop needs no separate instrumentation. The daemon hands a snapshot over with
:meth:`StatusMetrics.update` (each round, and whenever it likes); scrapes, served by
prometheus_client's HTTP thread, read the latest snapshot. A status is frozen once built, so the
HTTP thread reads it without copies or locks (the assignment is atomic under the GIL).

Owns the metric names and the reason-label policy; it must not reach into the daemon.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from peerd.control.status import Status
from peerd.core.reasons import Reason

#: Label values allowed for ``reason``: a peer-chosen string must not create new time
#: series (unbounded label cardinality would grow the daemon's and Prometheus' memory).
KNOWN_REASONS = frozenset(r.value for r in Reason)
OTHER_REASON = "other"
#: ``reason`` of ``peerd_learner_failed``: peerd.learn.learner.contract.Refusal's values (a
#: test holds them equal; this module does not import torch).
LEARNER_REASONS = frozenset(("raised", "timeout", "crashed", "schema", "non_finite",
                             "examples", "malformed"))
#: At most this many ``peerd_learner_metric`` series (the daemon keeps as many names).
MAX_LEARNER_METRICS = 32
#: Bound on joining the HTTP thread at shutdown: SIGTERM handling must finish in time.
STOP_TIMEOUT_S = 5.0


class StatusMetrics(Collector):
    """A prometheus_client collector over the latest status snapshot."""

    def __init__(self) -> None:
        self._snapshot: Status | None = None

    def update(self, status: Status) -> None:
        self._snapshot = status

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        s = self._snapshot
        up = GaugeMetricFamily("peerd_up", "1 once the daemon has published a status")
        up.add_metric([], 0.0 if s is None else 1.0)
        yield up
        if s is None:
            return
        node = s.node
        gauges: dict[str, tuple[float | None, str]] = {
            "peerd_round": (node.round, "Current training round"),
            "peerd_model_version": (node.version, "Version of the own published model"),
            "peerd_train_loss": (node.train_loss, "Training loss of the last round"),
            "peerd_val_accuracy": (node.val_accuracy, "Accuracy on the held-out local data"),
            "peerd_examples": (node.examples, "Local training examples"),
        }
        for name, (value, doc) in gauges.items():
            if value is not None:  # no loss before the first round: no sample, not NaN
                g = GaugeMetricFamily(name, doc)
                g.add_metric([], float(value))
                yield g
        g = GaugeMetricFamily("peerd_cache_entries", "Peer entries held in the cache")
        g.add_metric([], float(len(s.cache)))
        yield g
        ages = [row.age_s for row in s.cache]
        if ages:  # an empty cache has no age: no sample rather than a made-up 0
            for which, age in (("oldest", max(ages)), ("newest", min(ages))):
                g = GaugeMetricFamily(f"peerd_cache_{which}_age_seconds",
                                      f"Age of the {which} entry in the cache (since created)")
                g.add_metric([], float(age))
                yield g
        g = GaugeMetricFamily("peerd_peers", "Known peers by connection state",
                              labels=["state"])
        connected = sum(1 for p in s.peers if p.connected)
        g.add_metric(["connected"], float(connected))
        g.add_metric(["disconnected"], float(len(s.peers) - connected))
        yield g
        # Lifetime totals: peers no longer listed count too.
        for moved, name, doc in ((node.bytes_in, "received", "received from"),
                                 (node.bytes_out, "sent", "sent to")):
            c = CounterMetricFamily(f"peerd_bytes_{name}", f"Bytes {doc} peers")
            c.add_metric([], float(moved))
            yield c
        c = CounterMetricFamily("peerd_entry_bytes", "Bytes of entries (signed body and "
                                "payload) sent and received, by entry kind",
                                labels=["direction", "kind"])
        for key, moved_bytes in sorted(s.entry_bytes.items()):
            direction, _, kind = key.partition("/")
            c.add_metric([direction, kind], float(moved_bytes))
        yield c
        c = CounterMetricFamily("peerd_entries_accepted", "Entries accepted into the cache")
        c.add_metric([], float(s.accepted))
        yield c
        for key, doc in (("busy_refusals", "Inbound sessions refused while "
                          "max_inbound_sessions ran"),
                         ("duplicates_avoided", "Entries left out of a Want because another "
                          "session was fetching them"),
                         ("sweeps", "Gossip sweeps over the known peers"),
                         ("dials", "Gossip sessions this node started")):
            c = CounterMetricFamily(f"peerd_gossip_{key}", doc)
            c.add_metric([], float(s.gossip.get(key, 0)))
            yield c
        # High-water marks since start: the fanout bound at work (never above [network] fanout).
        for key, doc in (("most_dials_in_a_sweep", "Most sessions started in one sweep"),
                         ("most_outbound_at_once", "Most of this node's own sessions running "
                          "at once")):
            g = GaugeMetricFamily(f"peerd_gossip_{key}", doc)
            g.add_metric([], float(s.gossip.get(key, 0)))
            yield g
        by_reason: dict[str, float] = {}
        # Refused (hostile or broken) and dropped (benign: stale, not newer, evicted) alike:
        # the two sets of reasons are disjoint, so one labelled counter holds both.
        for reason, count in [*s.rejected.items(), *s.dropped.items()]:
            label = reason if reason in KNOWN_REASONS else OTHER_REASON
            by_reason[label] = by_reason.get(label, 0.0) + float(count)
        c = CounterMetricFamily("peerd_entries_rejected", "Entries refused or dropped, by reason",
                                labels=["reason"])
        for label, total in sorted(by_reason.items()):
            c.add_metric([label], total)
        yield c
        yield from _learner(s)
        yield from _tracking(s)


def _learner(s: Status) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
    """A learner of the user's: failed rounds by reason and its last metrics. Both label
    sets are bounded whatever the learner does: ``reason`` by the closed set of refusals
    (anything else would be "other"), ``name`` by the daemon, which shows at most 32 metric
    names over its life (peerd.learn.learner.stats)."""
    lr = s.learner
    if lr is None:
        return
    c = CounterMetricFamily("peerd_learner_failed", "Rounds whose learner failed, by reason "
                            "(nothing published)", labels=["reason"])
    by_reason: dict[str, float] = {}
    for reason, count in lr.failed.items():
        label = reason if reason in LEARNER_REASONS else OTHER_REASON
        by_reason[label] = by_reason.get(label, 0.0) + float(count)
    for label, total in sorted(by_reason.items()):
        c.add_metric([label], total)
    yield c
    c = CounterMetricFamily("peerd_learner_worker_restarts",
                            "Times the learner's worker process was started again")
    c.add_metric([], float(lr.worker_restarts))
    yield c
    if lr.external is not None:
        g = GaugeMetricFamily("peerd_learner_external_clients",
                              "Training processes attached to the learner socket")
        g.add_metric([], float(lr.external.clients))
        yield g
        c = CounterMetricFamily("peerd_learner_external_publishes",
                                "Publishes of the external learner accepted by the checks")
        c.add_metric([], float(lr.external.publishes))
        yield c
    g = GaugeMetricFamily("peerd_learner_metric", "The learner's metrics of its last fit",
                          labels=["name"])
    for name, value in sorted(lr.metrics.items())[:MAX_LEARNER_METRICS]:
        if math.isfinite(value):
            g.add_metric([name], float(value))
    yield g


def _tracking(s: Status) -> Iterable[CounterMetricFamily]:
    """``[tracking]``: rounds written and failed rounds by sink (``sink``: mlflow or
    tensorboard, the configured ones: a fixed set)."""
    t = s.tracking
    if t is None:
        return
    c = CounterMetricFamily("peerd_tracking_rounds_written",
                            "Rounds every [tracking] sink wrote")
    c.add_metric([], float(t.written))
    yield c
    c = CounterMetricFamily("peerd_tracking_failed", "Rounds a [tracking] sink failed to "
                            "write, by sink", labels=["sink"])
    for sink in t.sinks:
        c.add_metric([sink], float(t.failed.get(sink, 0)))
    yield c


def parse_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` / ``"[::1]:9464"`` -> (host, port); config already validated it."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def start_metrics_server(listen: str, metrics: StatusMetrics) -> tuple[int, Callable[[], None]]:
    """Serve ``/metrics`` on ``listen`` in a background thread; (bound port, stop function).

    Only our collector is registered (a private registry): libraries' default-registry
    metrics (py-libp2p registers some) are not exposed by accident.
    """
    host, port = parse_listen(listen)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    server, thread = start_http_server(port, addr=host, registry=registry)
    lock = threading.Lock()

    def stop() -> None:
        with lock:
            server.shutdown()
            server.server_close()
            thread.join(STOP_TIMEOUT_S)

    return int(server.server_port), stop
