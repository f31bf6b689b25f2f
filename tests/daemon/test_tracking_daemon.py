"""``[tracking]`` (issue 26 item 8): its keys, a sink whose package is missing as one start-up
line, and a real ``Daemon``'s rounds in the MLflow store and TensorBoard files it names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from rich.text import Text

from peerd.cli.status import tracking_line
from peerd.control.metrics import StatusMetrics, start_metrics_server
from peerd.control.status import TrackingStatus, from_json, to_json
from peerd.core.modes import ModeName
from peerd.daemon import tracking
from peerd.daemon.config import ConfigError, TrackingConfig, load_config, loads_config
from peerd.daemon.daemon import Daemon
from peerd.daemon.startup import DaemonError
from tests.control.test_metrics import scrape
from tests.control.test_tracking import NOT_INSTALLED
from tests.daemon.modefleet import Clock, mode_configs
from tests.daemon.test_config import FLEET, doc, write


def test_tracking_is_off_by_default_and_paths_are_the_config_files(tmp_path: Path) -> None:
    assert loads_config(doc()).tracking == TrackingConfig()
    assert TrackingConfig().sinks == ()
    cfg = load_config(write(tmp_path, FLEET + '[tracking]\nmlflow = "file:runs"\n'
                                              'experiment = "lab"\ntensorboard = "tb"\n'))
    assert cfg.tracking == TrackingConfig(mlflow=tmp_path / "runs", experiment="lab",
                                          tensorboard=tmp_path / "tb")
    assert cfg.tracking.sinks == ("mlflow", "tensorboard")
    for spelled in ("file:///srv/mlruns", "file:/srv/mlruns", "/srv/mlruns"):
        assert loads_config(doc(tracking={"mlflow": spelled})).tracking.mlflow == \
            Path("/srv/mlruns")


@pytest.mark.parametrize(("tracking", "message"), [
    ({"mlflow": "http://mlflow.lan:5000"}, "[tracking] mlflow: must be an MLflow file store "
                                           "(file:/path or a path), got"),
    ({"mlflow": "sqlite:///x.db"}, "[tracking] mlflow: must be an MLflow file store"),
    ({"tensorboard": 3}, "[tracking] tensorboard: must be a non-empty path string"),
    ({"mlflow": "/x", "experiment": ""}, "[tracking] experiment: must be printable text"),
    ({"experiment": "lab"}, "[tracking] experiment: only with mlflow"),
    ({"wandb": "x"}, "[tracking] wandb: unknown key (known: experiment, mlflow, "
                     "tensorboard)"),
])
def test_bad_tracking_settings_name_the_key(tracking: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_config(doc(tracking=tracking))
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_a_sink_whose_package_is_missing_stops_start_up_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tracking._installed("peerd")
    assert not tracking._installed("no_such_package_here")
    (cfg,) = mode_configs(tmp_path, ModeName.WEIGHTS, n=1)
    monkeypatch.setattr(tracking, "_installed", lambda package: package != "tensorboard")
    with pytest.raises(DaemonError) as err:  # cli/run.py: DaemonError is exit status 2
        Daemon(dataclasses.replace(cfg, tracking=TrackingConfig(tensorboard=tmp_path / "tb")))
    assert str(err.value) == ("[tracking] tensorboard: the tensorboard package is not "
                              "installed (pip install 'peerd[tracking]')")


def test_a_daemons_rounds_land_in_mlflow_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason=NOT_INSTALLED)
    pytest.importorskip("tensorboard", reason=NOT_INSTALLED)
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (cfg,) = mode_configs(tmp_path, ModeName.WEIGHTS, n=1)
    store, tb = tmp_path / "mlruns", tmp_path / "tb"
    d = Daemon(dataclasses.replace(cfg, tracking=TrackingConfig(mlflow=store,
                                                                tensorboard=tb)),
               clock=Clock())
    try:
        losses = []
        for _ in range(2):
            trio.run(d._round)
            losses.append(d.metrics.train_loss)
    finally:
        d.close()  # writes what is queued, ends the MLflow run
    assert d.tracking is not None
    assert d.tracking.snapshot().written == 2
    client = MlflowClient(tracking_uri=store.as_uri())
    exp = client.get_experiment_by_name("peerd")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags["peerd.node"] == d.node.id
    assert run.data.params["mode"] == "weights"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == list(zip((1, 2), losses, strict=True))
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert [e.step for e in acc.Scalars("val_accuracy")] == [1, 2]
    assert [e.value for e in acc.Scalars("version")] == [float(d.metrics.version - 1),
                                                         float(d.metrics.version)]
    assert "learner_failed" not in acc.Tags()["scalars"]  # the builtin learner: none


def test_the_status_prometheus_and_peerd_status_count_what_the_sinks_did(
        tmp_path: Path) -> None:
    (cfg,) = mode_configs(tmp_path, ModeName.WEIGHTS, n=1)
    assert Daemon(cfg, clock=Clock()).status().tracking is None  # no [tracking]: no block
    d = Daemon(dataclasses.replace(cfg, tracking=TrackingConfig(tensorboard=tmp_path / "tb")),
               clock=Clock())
    assert d.tracking is not None
    d.tracking.sinks = [Failing()]  # a sink that fails every round, in the writer's thread
    try:
        trio.run(d._round)
        trio.run(d._round)
    finally:
        d.close()
    status = d.status()
    assert status.tracking == TrackingStatus(
        sinks=("tensorboard",), written=0, failed={"tensorboard": 2}, dropped_rounds=0,
        names_dropped=0, last_error="tensorboard: PermissionError: [Errno 13] denied")
    assert d.metrics.round == 2  # the rounds went on
    assert from_json(json.loads(json.dumps(to_json(status)))).tracking == status.tracking
    metrics = StatusMetrics()
    port, stop = start_metrics_server("127.0.0.1:0", metrics)
    try:
        metrics.update(status)
        got = scrape(port)
    finally:
        stop()
    assert got['peerd_tracking_failed_total{sink="tensorboard"}'] == 2.0
    assert got["peerd_tracking_rounds_written_total"] == 0.0
    line = tracking_line(status.tracking)
    assert isinstance(line, Text)
    assert line.plain == ("tracking: tensorboard: 0 rounds written; failed rounds: "
                          "tensorboard 2; 0 dropped; last error: tensorboard: "
                          "PermissionError: [Errno 13] denied")


class Failing:
    name = "tensorboard"

    def write(self, r: object, values: object) -> None:
        raise PermissionError(13, "denied")

    def close(self) -> None:
        pass
