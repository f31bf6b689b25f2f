"""The ``[task]`` section: what a node trains on, parsed and cross-checked.

Split out of :mod:`peerd.daemon.config` so that the learning modes' checks
(:mod:`peerd.daemon.config_learning`) can read the task without importing the loader. Like
it, this module must not import torch, libp2p or trio (``peerd status`` loads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from peerd.daemon import config_limits as lim
from peerd.daemon.config_checks import (
    Check,
    ConfigError,
    check_choice,
    check_int,
    check_model_name,
    check_optional,
    check_partition,
    check_str,
    check_str_list,
    check_task_name,
)

#: ``[task] name`` of the time-bucket sensors (``[learning] mode = "sensors"`` implies it).
SENSOR_TASK = "sensors"


@dataclass(frozen=True, slots=True)
class TaskConfig:
    #: digits | mnist | fashion-mnist | csv | sensors | package.module:attr
    name: str = "digits"
    #: Demo tasks: iid | shards | dirichlet:PI, and this node's slice of node_count.
    partition: str = "dirichlet:0.5"
    node_index: int = 0
    node_count: int = 1
    seed: int = 0
    csv_glob: str | None = None
    csv_label: str = "label"
    #: Feature columns; empty = every column but the label.
    csv_features: tuple[str, ...] = ()
    csv_kind: Literal["classification", "regression"] = "classification"
    #: small | medium | large | cnn | mlp | linear | package.module:attr; None: the task's
    #: default. Knowledge mode lets every node pick its own; weight mode needs one fleet-wide.
    model: str | None = None


TASK_CHECKS: dict[str, Check] = {
    "name": check_task_name, "partition": check_partition, "node_index": check_int(0),
    "node_count": check_int(1), "seed": check_int(0), "csv_glob": check_optional(check_str),
    "csv_label": check_str, "csv_features": check_str_list(lim.MAX_CSV_FEATURES),
    "csv_kind": check_choice("classification", "regression"),
    "model": check_optional(check_model_name),
}


def check_task(task: TaskConfig) -> None:
    """What ``[task]``'s keys require of each other (the modes' needs: config_learning)."""
    if task.node_index >= task.node_count:
        raise ConfigError(f"[task] node_index: must be < node_count ({task.node_count}), "
                          f"got {task.node_index}")
    if task.name == "csv" and task.csv_glob is None:
        raise ConfigError("[task] csv_glob: required when name = \"csv\"")
