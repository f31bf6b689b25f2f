"""``[tracking]`` at start-up: the sinks of :mod:`peerd.control.tracking` for this node, and a
configured sink whose package is missing as one start-up line (exit status 2).

Only whether the package is installed is checked here (``importlib.util.find_spec``: no
import, so start-up stays fast); the sinks import it in their own thread with the first round.
"""

from __future__ import annotations

import importlib.util
import time

from peerd.control.tracking import MlflowSink, Sink, TensorBoardSink, TrackingWriter
from peerd.daemon.config import Config
from peerd.daemon.startup import DaemonError

#: The package each sink imports, checked at start-up.
PACKAGES = {"mlflow": "mlflow", "tensorboard": "tensorboard"}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def open_tracking(cfg: Config, node_id: str) -> TrackingWriter | None:
    """The writer of ``[tracking]``'s sinks (None when none is configured)."""
    tc = cfg.tracking
    for name in tc.sinks:
        if not _installed(PACKAGES[name]):
            raise DaemonError(f"[tracking] {name}: the {PACKAGES[name]} package is not "
                              "installed (pip install 'peerd[tracking]')")
    sinks: list[Sink] = []
    if tc.mlflow is not None:
        runs = cfg.status_config()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        sinks.append(MlflowSink(
            tc.mlflow, tc.experiment, run_name=f"{node_id[-8:]} {started}",
            tags={"peerd.node": node_id, "peerd.fleet": cfg.fleet.fleet_id.hex()},
            params={"mode": runs.mode, "blend": runs.blend, "learner": runs.learner,
                    "task": runs.task}))
    if tc.tensorboard is not None:
        sinks.append(TensorBoardSink(tc.tensorboard))
    return TrackingWriter(sinks) if sinks else None
