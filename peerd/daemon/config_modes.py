"""The configuration's cross-checks that a learning mode or local policy imposes.

Knowledge mode (FedCache), cordial mode (Pairwise-10 or time-bucket sensors) and the FedBSS
curriculum each need some other settings at particular values (a classification task, the
default blend, a capacity that fits a Digest, ...): :func:`check_mode` refuses a config that
mixes them wrongly, with a :class:`~peerd.daemon.config_checks.ConfigError` naming the key.
Split out of ``config.py``, which calls it once every section has been read; like it, this
module must not import torch, libp2p or trio (``peerd status`` loads it).
"""

from __future__ import annotations

from typing import Protocol

from peerd.core.modes import ModeName
from peerd.core.timebuckets import VIEW_IDS, ring_slack
from peerd.daemon.config_checks import ConfigError
from peerd.daemon.config_limits import MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT
from peerd.protocol.limits import MAX_DIGEST_ITEMS


class LearningConfig(Protocol):
    """What the checks read of ``[learning]`` (peerd.daemon.config.LearningConfig; a Protocol:
    config.py imports this module)."""

    @property
    def mode(self) -> str: ...
    @property
    def local_policy(self) -> str: ...
    @property
    def blend(self) -> str: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def capacity(self) -> int: ...
    @property
    def group(self) -> str | None: ...
    @property
    def tau_max(self) -> float: ...
    @property
    def cordial_window(self) -> int: ...
    @property
    def cordial_bucket_s(self) -> float: ...
    @property
    def cordial_images_per_digit(self) -> int: ...


class TaskConfig(Protocol):
    """What the checks read of ``[task]`` (peerd.daemon.config.TaskConfig)."""

    @property
    def name(self) -> str: ...
    @property
    def csv_kind(self) -> str: ...
    @property
    def node_count(self) -> int: ...


#: The blend and local policy a mode runs whatever ``[learning]`` says (check_mode keeps
#: those keys at their defaults there): None where the configured ones run.
_FIXED: dict[ModeName, tuple[str, str] | None] = {
    ModeName.WEIGHTS: None,
    ModeName.KNOWLEDGE: ("none", "distillation"),  # core.round: blend none, Distillation
    ModeName.CORDIAL: ("none", "two-time-scale"),  # core.cordial: agents, no model average
    ModeName.SENSORS: ("none", "two-time-scale"),
}


def what_runs(learning: LearningConfig, task: TaskConfig) -> tuple[ModeName, str, str]:
    """The mode, blend rule and local policy a checked config runs (what the status says).

    The sensor variant is cordial mode with ``[task] name = "sensors"`` until the config
    names it as a mode of its own (issue 25, item 2); the status names it already."""
    mode = ModeName(learning.mode)
    if mode is ModeName.CORDIAL and task.name == "sensors":
        mode = ModeName.SENSORS
    fixed = _FIXED[mode]
    blend, policy = fixed if fixed is not None else (learning.blend, learning.local_policy)
    return mode, blend, policy


def check_mode(learning: LearningConfig, task: TaskConfig | None) -> None:
    """What the learning mode and local policy require of the other settings."""
    if learning.local_policy == "fedbss":
        if learning.mode == "knowledge":
            raise ConfigError('[learning] local_policy: "fedbss" needs mode = "weights" '
                              '(knowledge mode trains by distillation)')
        if task is not None and task.name == "csv" and task.csv_kind == "regression":
            raise ConfigError('[learning] local_policy: "fedbss" needs a classification task '
                              '(it scores samples by their true class), got [task] csv_kind = '
                              '"regression"')
    if learning.mode == "knowledge":
        if task is not None and task.name == "csv" and task.csv_kind == "regression":
            # Knowledge is per-sample class logits retrieved by same-label neighbours.
            raise ConfigError('[learning] mode: "knowledge" needs a classification task, '
                              'got [task] csv_kind = "regression"')
        if learning.blend != "weighted":
            raise ConfigError('[learning] blend: must be "weighted" in mode = "knowledge" '
                              f"(knowledge mode averages no models), got {learning.blend!r}")
        if learning.epsilon > 0:
            raise ConfigError('[learning] epsilon: must be 0 in mode = "knowledge" (logits '
                              f"change every round and cost little), got {learning.epsilon:g}")
        # A knowledge node announces two entries per origin (knowledge and keys), own
        # included: all of them must fit one Digest.
        most = MAX_DIGEST_ITEMS // 2 - 1
        if learning.capacity > most:
            raise ConfigError(f'[learning] capacity: at most {most} in mode = "knowledge" '
                              f"(a Digest lists two entries per origin), got "
                              f"{learning.capacity}")
    if learning.mode == "cordial":
        _check_cordial(learning, task)


def _check_cordial(learning: LearningConfig, task: TaskConfig | None) -> None:
    """Cordial mode runs Pairwise-10 or sensors: one agent per node, a view per peer agent."""
    agents = task.node_count if task is not None else 1
    if task is None or task.name not in ("digits", "mnist", "sensors"):
        raise ConfigError('[task] name: mode = "cordial" runs Pairwise-10 composites of '
                          'scikit-learn digits or MNIST, or time-bucket sensors; set name = '
                          '"digits", "mnist" or "sensors"')
    sensors = task.name == "sensors"
    if task.name == "digits" and \
            learning.cordial_images_per_digit > MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT:
        raise ConfigError(f"[learning] cordial_images_per_digit: at most "
                          f"{MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT} with [task] name = "
                          f'"digits" (its rarest test digit has that many images), got '
                          f"{learning.cordial_images_per_digit}")
    if agents < 2 or (agents % 2 and not sensors):
        raise ConfigError('[task] node_count: mode = "cordial" needs ' + (
            ">= 2 agents" if sensors else "an even number of agents >= 2 (digit pairs)") +
            f", got {agents}")
    if sensors and ring_slack(learning.cordial_window, learning.tau_max,
                              learning.cordial_bucket_s) < 0:  # an old id read as a new bucket
        raise ConfigError(f"[learning] cordial_window: {learning.cordial_window} buckets plus "
                          f"tau_max / cordial_bucket_s = {learning.tau_max:g} / "
                          f"{learning.cordial_bucket_s:g} must stay under {VIEW_IDS} bucket ids")
    if learning.group is not None:
        raise ConfigError('[learning] group: set by mode = "cordial" (agent-<node_index>), '
                          "leave it out")
    if learning.capacity < agents - 1:
        raise ConfigError(f'[learning] capacity: must be >= node_count - 1 = {agents - 1} in '
                          f'mode = "cordial" (one view per peer agent), got {learning.capacity}')
    if learning.blend != "weighted" or learning.epsilon > 0 or \
            learning.local_policy != "plain":
        raise ConfigError('[learning] blend, epsilon, local_policy: mode = "cordial" averages no '
                          "models; leave them at their defaults")
