"""The ``[tracking]`` section: where each round's metrics are written besides the round log.

```toml
[tracking]
mlflow = "file:/var/lib/peerd/mlruns"   # an MLflow file store (a folder; "file:" optional)
experiment = "peerd"                    # the MLflow experiment the node's run goes into
tensorboard = "/var/lib/peerd/tb"       # a folder of TensorBoard event files
```

Both sinks are optional and need the ``tracking`` extra (``pip install 'peerd[tracking]'``:
mlflow-skinny, tensorboard); the daemon checks at start-up that a configured sink's package
is installed (:mod:`peerd.daemon.tracking`), the loader only the values. Only MLflow's file
store is taken: it works offline, and a tracking server's URI would make the node's metrics
depend on a network the fleet may not have. Relative paths are the config file's folder's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd.daemon.config_checks import (
    BadValueError,
    Check,
    ConfigError,
    check_optional,
    check_path,
    check_table,
    shown,
)

#: The longest MLflow experiment name taken (MLflow's own bound is far larger; a name is
#: a label, not a document).
MAX_EXPERIMENT_LEN = 256


@dataclass(frozen=True, slots=True)
class TrackingConfig:
    #: The MLflow file store's folder (None: no MLflow run).
    mlflow: Path | None = None
    experiment: str = "peerd"
    #: The folder TensorBoard event files are written to (None: none).
    tensorboard: Path | None = None

    @property
    def sinks(self) -> tuple[str, ...]:
        """The configured sinks' names, in a fixed order."""
        return tuple(name for name in ("mlflow", "tensorboard")
                     if getattr(self, name) is not None)


def check_file_store(v: Any) -> Path:
    """``file:PATH`` (``file://PATH``) or a plain path: an MLflow file store's folder."""
    if isinstance(v, str) and ":" in v.split("/", 1)[0]:
        scheme, _, rest = v.partition(":")
        if scheme != "file":
            raise BadValueError(f"must be an MLflow file store (file:/path or a path), got "
                                f"{shown(v)}: tracking servers ({scheme}:) are not supported")
        v = rest[2:] if rest.startswith("//") else rest
    return check_path(v)


def check_experiment(v: Any) -> str:
    if isinstance(v, str) and v.strip() and len(v) <= MAX_EXPERIMENT_LEN and v.isprintable():
        return v
    raise BadValueError(f"must be printable text of 1 to {MAX_EXPERIMENT_LEN} characters, "
                        f"got {shown(v)}")


TRACKING_CHECKS: dict[str, Check] = {
    "mlflow": check_optional(check_file_store), "experiment": check_experiment,
    "tensorboard": check_optional(check_path),
}


def read_tracking(raw: Any, base: Path | None) -> TrackingConfig:
    """``[tracking]``, each key checked (unknown keys refused, as in every section)."""
    tracking = TrackingConfig(**check_table("[tracking]", raw, TRACKING_CHECKS, base=base))
    if "experiment" in raw and tracking.mlflow is None:
        raise ConfigError("[tracking] experiment: only with mlflow (the MLflow file store)")
    return tracking
