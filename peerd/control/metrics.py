"""Optional Prometheus endpoint (``[network] metrics_listen``), fed from the status dict.

The daemon already builds one status dict for ``peerd status`` (shape in
:mod:`peerd.control.server`); the metrics are derived from the same dict, so the two views can never
disagree and the round loop needs no separate instrumentation. The daemon hands a snapshot
over with :meth:`StatusMetrics.update` (each round, and whenever it likes); scrapes, served by
prometheus_client's HTTP thread, read the latest snapshot. The snapshot is a deep copy, so the
HTTP thread never iterates a dict that the trio thread is changing.

Optional extra status fields used when present: ``node.bytes_in`` / ``node.bytes_out``
(lifetime totals; otherwise the per-peer counters are summed) and ``accepted`` (entries
accepted into the cache).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from peerd.core.reasons import Reason

#: Label values allowed for ``reason``: a peer-chosen string must not create new time
#: series (unbounded label cardinality would grow the daemon's and Prometheus' memory).
KNOWN_REASONS = frozenset(r.value for r in Reason)
OTHER_REASON = "other"
#: Bound on joining the HTTP thread at shutdown: SIGTERM handling must finish in time.
STOP_TIMEOUT_S = 5.0


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _dict(parent: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _list(parent: Mapping[str, Any], key: str) -> list[Any]:
    value = parent.get(key)
    return value if isinstance(value, list) else []


class StatusMetrics(Collector):
    """A prometheus_client collector over the latest status snapshot."""

    def __init__(self) -> None:
        self._snapshot: dict[str, Any] | None = None

    def update(self, status: Mapping[str, Any]) -> None:
        # JSON round trip = deep copy of plain data; the assignment is atomic under the GIL.
        self._snapshot = json.loads(json.dumps(status, default=str))

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        s = self._snapshot
        up = GaugeMetricFamily("peerd_up", "1 once the daemon has published a status")
        up.add_metric([], 0.0 if s is None else 1.0)
        yield up
        if s is None:
            return
        node = _dict(s, "node")
        gauges = {
            "peerd_round": ("round", "Current training round"),
            "peerd_model_version": ("version", "Version of the own published model"),
            "peerd_train_loss": ("train_loss", "Training loss of the last round"),
            "peerd_val_accuracy": ("val_accuracy", "Accuracy on the held-out local data"),
            "peerd_examples": ("examples", "Local training examples"),
        }
        for name, (key, doc) in gauges.items():
            value = _num(node.get(key))
            if value is not None:
                g = GaugeMetricFamily(name, doc)
                g.add_metric([], value)
                yield g
        cache = _list(s, "cache")
        g = GaugeMetricFamily("peerd_cache_entries", "Peer entries held in the cache")
        g.add_metric([], float(len(cache)))
        yield g
        peers = [p for p in _list(s, "peers") if isinstance(p, dict)]
        g = GaugeMetricFamily("peerd_peers", "Known peers by connection state",
                              labels=["state"])
        connected = sum(1 for p in peers if p.get("connected"))
        g.add_metric(["connected"], float(connected))
        g.add_metric(["disconnected"], float(len(peers) - connected))
        yield g
        for direction in ("in", "out"):
            total = _num(node.get(f"bytes_{direction}"))
            if total is None:
                total = sum(_num(p.get(f"bytes_{direction}")) or 0.0 for p in peers)
            c = CounterMetricFamily(f"peerd_bytes_{'received' if direction == 'in' else 'sent'}",
                                    f"Bytes {'received from' if direction == 'in' else 'sent to'}"
                                    " peers")
            c.add_metric([], total)
            yield c
        accepted = _num(s.get("accepted"))
        if accepted is not None:
            c = CounterMetricFamily("peerd_entries_accepted", "Entries accepted into the cache")
            c.add_metric([], accepted)
            yield c
        by_reason: dict[str, float] = {}
        # Refused (hostile or broken) and dropped (benign: stale, not newer, evicted) alike:
        # the two sets of reasons are disjoint, so one labelled counter holds both.
        for reason, count in [*_dict(s, "rejected").items(), *_dict(s, "dropped").items()]:
            label = reason if reason in KNOWN_REASONS else OTHER_REASON
            by_reason[label] = by_reason.get(label, 0.0) + (_num(count) or 0.0)
        c = CounterMetricFamily("peerd_entries_rejected", "Entries refused or dropped, by reason",
                                labels=["reason"])
        for label, count in sorted(by_reason.items()):
            c.add_metric([label], count)
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
