"""The Prometheus endpoint serves values derived from the typed status (loopback only)."""

from __future__ import annotations

import dataclasses
import urllib.request

from peerd.control.metrics import StatusMetrics, parse_listen, start_metrics_server
from tests.daemon.helpers import sample_status

#: Bound on one scrape of a loopback endpoint.
SCRAPE_TIMEOUT_S = 5.0


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=SCRAPE_TIMEOUT_S) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_follow_the_status_snapshot() -> None:
    metrics = StatusMetrics()
    port, stop = start_metrics_server("127.0.0.1:0", metrics)
    try:
        assert scrape(port) == {"peerd_up": 0.0}  # nothing published yet
        status = sample_status(round_=5)
        # A reason the daemon never counts must not create a new label value.
        status = dataclasses.replace(status, rejected={**status.rejected, "made_up_by_a_peer": 4})
        metrics.update(status)
        got = scrape(port)
        assert got["peerd_up"] == 1.0
        assert got["peerd_round"] == 5.0
        assert got["peerd_model_version"] == 7.0
        assert got["peerd_train_loss"] == 0.42
        assert got["peerd_val_accuracy"] == 0.91
        assert got["peerd_cache_entries"] == 1.0
        assert got['peerd_peers{state="connected"}'] == 1.0
        assert got["peerd_bytes_received_total"] == 1234.0
        assert got["peerd_bytes_sent_total"] == 5678.0
        assert got['peerd_entries_rejected_total{reason="bad_signature"}'] == 2.0
        assert got['peerd_entries_rejected_total{reason="other"}'] == 4.0
        assert not any("made_up" in k for k in got)
    finally:
        stop()


def test_accepted_dropped_and_byte_totals_are_served() -> None:
    metrics = StatusMetrics()
    port, stop = start_metrics_server("127.0.0.1:0", metrics)
    try:
        status = sample_status()
        # Totals since start: more than the peers still listed moved (some were forgotten).
        node = dataclasses.replace(status.node, bytes_in=99_000, bytes_out=88_000)
        metrics.update(dataclasses.replace(status, node=node, accepted=6,
                                           dropped={"not_newer": 2, "stale": 1},
                                           gossip={"busy_refusals": 3,
                                                   "duplicates_avoided": 7, "sweeps": 40,
                                                   "dials": 90, "most_dials_in_a_sweep": 3,
                                                   "most_outbound_at_once": 2}))
        got = scrape(port)
        assert got["peerd_entries_accepted_total"] == 6.0
        assert got["peerd_gossip_busy_refusals_total"] == 3.0
        assert got["peerd_gossip_duplicates_avoided_total"] == 7.0
        assert got["peerd_gossip_sweeps_total"] == 40.0
        assert got["peerd_gossip_dials_total"] == 90.0
        assert got["peerd_gossip_most_dials_in_a_sweep"] == 3.0
        assert got["peerd_gossip_most_outbound_at_once"] == 2.0
        assert got['peerd_entries_rejected_total{reason="not_newer"}'] == 2.0
        assert got['peerd_entries_rejected_total{reason="stale"}'] == 2.0  # 1 + 1 dropped
        assert got["peerd_bytes_received_total"] == 99_000.0
        assert got["peerd_bytes_sent_total"] == 88_000.0
    finally:
        stop()


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)


def test_no_loss_before_the_first_round_means_no_sample() -> None:
    # A missing number (null in the JSON) is left out, never served as NaN or 0.
    status = sample_status()
    node = dataclasses.replace(status.node, train_loss=None, val_accuracy=None)
    metrics = StatusMetrics()
    metrics.update(dataclasses.replace(status, node=node))
    names = {family.name for family in metrics.collect()}
    assert "peerd_round" in names
    assert "peerd_examples" in names
    assert "peerd_train_loss" not in names
    assert "peerd_val_accuracy" not in names
