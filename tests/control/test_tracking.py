"""Issue 26 item 8: each round's metrics to MLflow (file store) and TensorBoard event files,
read back with each tool's own reader; a failing or slow sink never holds up or stops the
rounds; the learner's metric names are bounded over the process's life.

The read-back tests need the ``tracking`` extra (scripts/setup installs it); without it they
are skipped, saying so.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from peerd.control.audit import AuditLearner
from peerd.control.tracking import (
    MAX_NAMES,
    QUEUE_ROUNDS,
    MlflowSink,
    NameBound,
    TensorBoardSink,
    TrackedRound,
    TrackingWriter,
    scalars,
    tracked_round,
)

NOT_INSTALLED = "the tracking extra is not installed: pip install -e '.[tracking]'"


def rounds() -> list[TrackedRound]:
    """Three rounds of a learner's node: the second one refused."""
    good = AuditLearner({"train_loss": 0.5, "lr/group 0": 1e-3}, {"accuracy": 0.75}, None, None)
    bad = AuditLearner({}, {}, "non_finite", "w: holds NaN")
    return [tracked_round(round_no=r, ts=1_800_000_000.0 + r, train_loss=1.0 / r if r != 2
                          else float("nan"), val_loss=0.9 / r, val_accuracy=0.1 * r,
                          examples=100, cache=r - 1, version=r, published=r != 2,
                          learner=bad if r == 2 else good)
            for r in (1, 2, 3)]


def _written(sinks: list[MlflowSink | TensorBoardSink]) -> TrackingWriter:
    w = TrackingWriter(list(sinks))
    for r in rounds():
        w.submit(r)
    w.close()
    return w


def test_an_mlflow_file_store_holds_one_run_with_every_rounds_metrics(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason=NOT_INSTALLED)
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    sink = MlflowSink(store, "fleet-a", run_name="node1", tags={"peerd.node": "12D3KooWx"},
                      params={"mode": "weights"})
    w = _written([sink])
    assert w.snapshot().written == 3
    assert w.snapshot().failed == {"mlflow": 0}
    client = MlflowClient(tracking_uri=store.as_uri())  # MLflow's own reader of the store
    exp = client.get_experiment_by_name("fleet-a")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "node1"
    assert run.info.status == "FINISHED"  # closed with the writer
    assert run.data.tags["peerd.node"] == "12D3KooWx"
    assert run.data.params == {"mode": "weights"}

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    assert history("train_loss") == [(1, 1.0), (3, 1.0 / 3)]  # round 2's NaN left out
    assert history("cache") == [(1, 0.0), (2, 1.0), (3, 2.0)]
    assert history("published") == [(1, 1.0), (2, 0.0), (3, 1.0)]
    assert history("learner_failed") == [(1, 0.0), (2, 1.0), (3, 0.0)]
    assert history("fit/train_loss") == [(1, 0.5), (3, 0.5)]
    assert history("eval/accuracy") == [(1, 0.75), (3, 0.75)]
    assert history("fit/lr/group 0") == [(1, 1e-3), (3, 1e-3)]


def test_tensorboard_event_files_hold_every_rounds_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason=NOT_INSTALLED)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = tmp_path / "tb"
    _written([TensorBoardSink(folder)])
    acc = EventAccumulator(str(folder))  # TensorBoard's own reader of the event files
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train_loss", "val_loss", "val_accuracy", "cache", "examples", "version",
            "published", "learner_failed", "fit/train_loss", "eval/accuracy"} <= tags

    def series(tag: str) -> list[tuple[int, float]]:
        return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]

    assert series("val_accuracy") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert series("train_loss") == [(1, 1.0), (3, round(1 / 3, 6))]
    assert series("learner_failed") == [(1, 0.0), (2, 1.0), (3, 0.0)]
    assert [e.wall_time for e in acc.Scalars("cache")] == [1_800_000_001.0, 1_800_000_002.0,
                                                           1_800_000_003.0]


class Broken:
    name = "mlflow"

    def __init__(self) -> None:
        self.calls = 0

    def write(self, r: TrackedRound, values: Mapping[str, float]) -> None:
        self.calls += 1
        if r.round != 3:
            raise OSError(28, "No space left on device")

    def close(self) -> None:
        raise RuntimeError("cannot close either")


class Kept:
    name = "tensorboard"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def write(self, r: TrackedRound, values: Mapping[str, float]) -> None:
        self.seen.append(r.round)

    def close(self) -> None:
        pass


def test_a_failing_sink_is_logged_once_counted_and_the_others_go_on(
        caplog: pytest.LogCaptureFixture) -> None:
    broken, kept = Broken(), Kept()
    w = TrackingWriter([broken, kept])
    with caplog.at_level(logging.INFO, logger="peerd.control.tracking"):
        for r in (*rounds(), *rounds()):  # rounds 1, 2 fail; 3 works; 1, 2 fail again
            w.submit(r)
        w.close()  # its sink's close raising is logged, not raised
    counts = w.snapshot()
    assert counts.failed == {"mlflow": 4, "tensorboard": 0}
    assert counts.written == 2  # the rounds every sink wrote
    assert "No space left on device" in (counts.last_error or "")
    assert kept.seen == [1, 2, 3, 1, 2, 3]
    assert broken.calls == 6  # tried again every round
    failed = [r.message for r in caplog.records if "tracking to mlflow failed" in r.message]
    assert len(failed) == 2  # once, then once more after it had worked again
    assert sum("works again" in r.message for r in caplog.records) == 2  # both round 3s


class Stuck:
    name = "tensorboard"

    def __init__(self) -> None:
        self.release = threading.Event()

    def write(self, r: TrackedRound, values: Mapping[str, float]) -> None:
        self.release.wait(30)

    def close(self) -> None:
        pass


def test_a_stuck_sink_never_holds_up_the_round() -> None:
    stuck = Stuck()
    w = TrackingWriter([stuck])
    (r, *_) = rounds()
    began = time.monotonic()
    for _ in range(QUEUE_ROUNDS + 20):
        w.submit(r)
    assert time.monotonic() - began < 1.0  # enqueued (or dropped), never waited on
    dropped = w.snapshot().dropped_rounds
    assert 19 <= dropped <= 20  # the thread took at most one before sticking
    stuck.release.set()
    w.close()
    assert w.snapshot().written == QUEUE_ROUNDS + 20 - dropped


def test_learner_metric_names_are_bounded_over_the_life_of_the_writer() -> None:
    bound = NameBound()
    kept = []
    for r in range(3):  # a learner naming a metric after its round, twenty at a time
        lr = AuditLearner({f"loss_{r}_{i}": 1.0 for i in range(20)}, {"acc": 1.0}, None, None)
        values = scalars(TrackedRound(r, 0.0, {"cache": 1.0}, lr), bound)
        kept.append(sorted(k for k in values if k.startswith("fit/")))
        assert values["eval/acc"] == 1.0  # another kind: a bound of its own
        assert values["cache"] == 1.0
    assert [len(k) for k in kept] == [20, MAX_NAMES - 20, 0]
    assert kept[1] == sorted(f"fit/loss_1_{i}" for i in range(MAX_NAMES - 20))
    assert bound.dropped == 3 * 20 - MAX_NAMES
    # An admitted name stays admitted: the first round's names are still written.
    again = scalars(TrackedRound(4, 0.0, {}, AuditLearner({"loss_0_0": 2.0}, {}, None, None)),
                    bound)
    assert again == {"fit/loss_0_0": 2.0, "learner_failed": 0.0}


def test_closing_sums_up_what_failed(caplog: pytest.LogCaptureFixture) -> None:
    w = TrackingWriter([Broken()])
    with caplog.at_level(logging.WARNING, logger="peerd.control.tracking"):
        for r in rounds():
            w.submit(r)
        w.close()
    (summary,) = [r.message for r in caplog.records if r.message.startswith("tracking: ")
                  and "rounds written" in r.message]
    assert "1 rounds written; failed by sink {'mlflow': 2}" in summary


def test_the_mlflow_sink_takes_the_file_store_and_sends_no_telemetry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow", reason=NOT_INSTALLED)
    for name in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_DISABLE_TELEMETRY"):
        monkeypatch.delenv(name, raising=False)
    sink = MlflowSink(tmp_path / "mlruns", "peerd", run_name="n", tags={}, params={})
    sink.write(rounds()[0], {"cache": 0.0})
    sink.close()
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
