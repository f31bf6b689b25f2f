"""The learner block of the status (issue 26, items 5 and 8): it round-trips through the JSON
codec, `peerd status` shows it, and Prometheus serves it with bounded labels."""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console

from peerd.cli.status import render_status
from peerd.control.metrics import LEARNER_REASONS, StatusMetrics, start_metrics_server
from peerd.control.status import ExternalStatus, LearnerStatus, Status, from_json, to_json
from peerd.learn.learner.check import MAX_METRICS
from peerd.learn.learner.contract import LearnerError, Refusal
from peerd.learn.learner.stats import LearnerStats
from tests.control.test_metrics import scrape
from tests.daemon.helpers import sample_status


def with_learner(**over: object) -> Status:
    st = LearnerStats(kind="python", entry="mypkg.train:learner", device="cpu")
    st.fitted({"train_loss": 0.25, "lr": 0.001})
    st.failed_round(4, LearnerError(Refusal.CRASHED, "the worker was killed by SIGKILL"))
    block = LearnerStatus(kind=st.kind, entry=st.entry, device=st.device,
                          metrics=st.metrics, metrics_dropped=st.metrics_dropped,
                          failed=st.failed, last_failure=st.last_failure,
                          last_detail=st.last_detail, last_failed_round=st.last_failed_round,
                          worker_pid=4242, worker_restarts=1)
    status = sample_status()
    return dataclasses.replace(status, learner=dataclasses.replace(block, **over),  # type: ignore[arg-type]
                               config=dataclasses.replace(status.config, learner="python"))


def test_the_learner_block_round_trips() -> None:
    status = with_learner()
    encoded = to_json(status)
    assert encoded["config"]["learner"] == "python"
    assert encoded["learner"]["failed"] == {r.value: int(r is Refusal.CRASHED)
                                            for r in Refusal}
    assert from_json(json.loads(json.dumps(encoded))) == status
    assert to_json(sample_status())["learner"] is None  # the builtin learner: no block


def test_peerd_status_shows_the_learner_and_its_failures() -> None:
    console = Console(record=True, width=200)
    render_status(console, with_learner())
    text = console.export_text()
    assert "learner python" in text
    assert "learner: python mypkg.train:learner on cpu, worker pid 4242 (1 restarts)" in text
    assert "learner metrics: lr 0.0010  train_loss 0.2500" in text
    assert ("learner failed rounds: crashed 1; last (round 4): crashed: the worker was "
            "killed by SIGKILL") in text


def test_the_reasons_of_the_metrics_are_the_contract_s() -> None:
    assert {r.value for r in Refusal} == LEARNER_REASONS


def test_metric_names_are_bounded_over_the_daemon_s_life() -> None:
    st = LearnerStats(kind="python", entry="m:x", device="cpu")
    for round_no in range(3):  # a learner naming a new metric every round
        st.fitted({f"loss_round_{round_no}_{i}": float(i) for i in range(20)})
    assert len(st._admitted) == MAX_METRICS
    assert len(st.metrics) == 0  # the third round's names all came after the first 32
    assert st.metrics_dropped == 8 + 20  # round 1 beyond the 32nd name, all of round 2


def test_prometheus_serves_failures_by_reason_and_the_last_metrics() -> None:
    metrics = StatusMetrics()
    port, stop = start_metrics_server("127.0.0.1:0", metrics)
    try:
        status = with_learner(failed={**with_learner().learner.failed,  # type: ignore[union-attr]
                                      "made_up": 3})
        metrics.update(status)
        got = scrape(port)
        assert got['peerd_learner_failed_total{reason="crashed"}'] == 1.0
        assert got['peerd_learner_failed_total{reason="raised"}'] == 0.0
        assert got['peerd_learner_failed_total{reason="other"}'] == 3.0
        assert not any("made_up" in k for k in got)
        assert got['peerd_learner_metric{name="train_loss"}'] == 0.25
        assert got["peerd_learner_worker_restarts_total"] == 1.0
        metrics.update(sample_status())
        assert not any("learner" in k for k in scrape(port))  # builtin: no learner series
    finally:
        stop()


def external_status(clients: int = 1) -> Status:
    ext = ExternalStatus(socket="/var/lib/peerd/learner.sock", clients=clients, blends=7,
                         publishes=5, last_publish=1_800_000_000.0, last_version=9)
    status = with_learner(kind="external", entry=None, worker_pid=None, worker_restarts=0,
                          external=ext)
    return dataclasses.replace(status, config=dataclasses.replace(status.config,
                                                                  learner="external"))


def test_an_external_learner_s_block_round_trips_shows_and_is_served() -> None:
    status = external_status()
    encoded = to_json(status)
    assert encoded["learner"]["external"] == {
        "socket": "/var/lib/peerd/learner.sock", "clients": 1, "blends": 7, "publishes": 5,
        "last_publish": 1_800_000_000.0, "last_version": 9}
    assert from_json(json.loads(json.dumps(encoded))) == status
    console = Console(record=True, width=240)
    render_status(console, status)
    text = console.export_text()
    assert ("learner: external on cpu, 1 client attached to /var/lib/peerd/learner.sock; "
            "last publish at ") in text
    assert "(version 9), 5 publishes, 7 blends" in text
    assert "learner failed rounds: crashed 1" in text  # refusals: the same line as a worker's
    console = Console(record=True, width=240)
    render_status(console, external_status(clients=0))
    assert "no client attached" in console.export_text()
    metrics = StatusMetrics()
    port, stop = start_metrics_server("127.0.0.1:0", metrics)
    try:
        metrics.update(status)
        got = scrape(port)
        assert got["peerd_learner_external_clients"] == 1.0
        assert got["peerd_learner_external_publishes_total"] == 5.0
        metrics.update(with_learner())
        assert not any("external" in k for k in scrape(port))  # a worker: no such series
    finally:
        stop()
