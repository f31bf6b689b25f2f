"""The ``[learning]`` section: what every mode shares, and one table per mode and policy.

``[learning]`` holds what every mode reads (τ_max, C, K, the round interval, the mode, the
blend, the local policy, the cache groups, ...). Each mode and policy has its own table,
parsed and checked here and nowhere else:

* ``[learning.knowledge]`` (``mode = "knowledge"``, FedCache): the sample key's width, the
  distillation's β, temperature and neighbours;
* ``[learning.cordial]`` (``mode = "cordial"`` and ``mode = "sensors"``): Pairwise-10's P,
  the coordination switch and warm-up, the sensors' time bucket and window;
* ``[learning.fedbss]`` (``local_policy = "fedbss"``): the curriculum's warm-up and budget.

What a mode requires of the other settings (a classification task, the default blend, a
capacity that fits a Digest, ...) is its entry of :data:`MODE_CHECKS`.

**Deprecated for one release**: the flat spellings (``distill_beta``, ``cordial_window``,
``fedbss_epochs``, ... in ``[learning]``; :data:`DEPRECATED`) and the sensors' old form
(``mode = "cordial"`` with ``[task] name = "sensors"``) are still read, each with a one-line
notice naming the new form (``Config.deprecations``, logged by ``peerd run`` at start-up);
a key set in both spellings is an error naming both.

Like :mod:`peerd.daemon.config`, this module must not import torch, libp2p or trio
(``peerd status`` loads it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from peerd.core.alpha import AlphaPolicy
from peerd.core.blendrules import Krum, parse_rule
from peerd.core.modes import ModeName
from peerd.core.timebuckets import VIEW_IDS, ring_slack
from peerd.daemon import config_limits as lim
from peerd.daemon.config_checks import (
    Check,
    ConfigError,
    check_alpha,
    check_blend,
    check_bool,
    check_choice,
    check_float,
    check_group,
    check_int,
    check_mode_name,
    check_optional,
    check_staleness,
    check_table,
    check_value,
    shown,
)
from peerd.daemon.config_task import SENSOR_TASK, TaskConfig
from peerd.protocol.limits import MAX_DIGEST_ITEMS, MAX_KEY_DIM

# ---------------------------------------------------------------------------- tables


@dataclass(frozen=True, slots=True)
class KnowledgeConfig:
    """``[learning.knowledge]``: FedCache's settings (``mode = "knowledge"``)."""

    #: The sample key's width (all nodes of a fleet must agree).
    key_dim: int = 64
    #: β: weight of the KL term towards the teachers.
    beta: float = 1.5
    #: Softmax temperature T (in eq18 of both terms, in code of the KL term). Unset: the
    #: form's (peerd.core.distill.DEFAULT_TEMPERATURE: 1 for eq18, 3 for code).
    temperature: float | None = None
    #: R: the neighbours' knowledge averaged per sample.
    neighbours: int = 16
    #: The objective (peerd.core.distill): "eq18" (the notes' eq. 18, the default; measured
    #: at T = 1 level with code on FashionMNIST, ~1.4 points lower on MNIST) or "code" (the
    #: paper code's CE + β·T²·KL(teacher ‖ student)).
    form: str = "eq18"
    #: What a sample with no neighbour learns from in the node's first round: "zero" (eq. 9:
    #: knowledge starts as C zeros, so it distils towards τ(0), uniform; the simulator's
    #: default) or "none" (cross-entropy only until a peer's knowledge arrives).
    round1_knowledge: str = "zero"


#: ``[learning]`` keys whose default differs in ``mode = "knowledge"``: the paper's one local
#: epoch (``local_steps = 0``: ⌈n / batch_size⌉ steps over the node's n samples), batch 8 and
#: lr 0.01 (seed fedcache-notes-zh.txt §5.1.1, §5.1.4), where weight mode keeps 10, 32, 0.05.
KNOWLEDGE_DEFAULTS: dict[str, Any] = {"local_steps": 0, "batch_size": 8, "lr": 0.01}


@dataclass(frozen=True, slots=True)
class CordialConfig:
    """``[learning.cordial]``: cordial learning's settings (``mode = "cordial"`` on
    Pairwise-10, ``mode = "sensors"`` on time buckets; [task] node_index is the agent,
    node_count the agents, seed the shared index's)."""

    #: Pairwise-10: P images per digit (the shared index is 27·P ids, fleet-wide).
    images_per_digit: int = 25
    #: Whether the agent uses its peers' views (false: the isolated baseline, views still
    #: published).
    coordination: bool = True
    #: Pairwise-10: the epochs the coordination layers stay frozen (the paper's K).
    warmup_epochs: int = 50
    #: Sensors (peerd.core.timebuckets): a time bucket's seconds and the last buckets kept,
    #: trained on and published. Fleet-wide (part of the view schema).
    bucket_s: float = 10.0
    window: int = 64


@dataclass(frozen=True, slots=True)
class FedBSSConfig:
    """``[learning.fedbss]``: the curriculum of ``local_policy = "fedbss"`` (peerd.core.fedbss)."""

    warmup_rounds: int = 20
    epochs: int = 10  # E: local epochs of one curriculum round
    regrow: float = 0.2  # warm up again once the data grew by this fraction
    #: SGD steps of one curriculum round over the E epochs; 0 = E full epochs.
    steps: int = 0


@dataclass(frozen=True, slots=True)
class LearningConfig:
    #: Staleness cutoff τ_max, in seconds.
    tau_max: float = 600.0
    #: Only "time": "rounds" is refused (see check_staleness); the simulator keeps round ages.
    staleness: Literal["time"] = "time"
    capacity: int = 10  # C: peer entries kept in the cache
    rho: float = 0.01  # ρ: proximal weight towards the blend
    local_steps: int = 10  # K
    batch_size: int = 32
    lr: float = 0.05
    alpha: str = "uniform"  # see peerd.core.alpha for the spellings
    #: Publish the own entry only when its drift exceeds ε (saves bandwidth on a plateau).
    epsilon: float = 0.0
    round_interval_s: float = 10.0
    #: With ε > 0: re-sign and publish the current model after this many seconds without a
    #: publication, so peers never age the node's entry out past τ_max. None: τ_max / 2.
    max_silence_s: float | None = None
    #: What a node gossips and how its round trains (peerd.core.modes): weights (Cached-DFL,
    #: models blended), knowledge (FedCache, logits distilled from; architectures may
    #: differ), cordial (Pairwise-10 views), sensors (cordial views on time buckets).
    mode: ModeName = ModeName.WEIGHTS
    #: Typed modes (knowledge, cordial, sensors): samples kept in the cache over all peers
    #: (besides C entries).
    sample_capacity: int = 100_000
    #: How peer models are combined: "weighted" (Σ α_j x_j) or a robust rule, "median",
    #: "trimmed[:β]", "clipped[:τ]", "krum[:f]" (peerd.core.blendrules; weight mode only).
    blend: str = "weighted"
    #: How the node trains after the blend: "plain" (K proximal steps) or "fedbss" (warm-up
    #: rounds, then a loss-sorted curriculum, [learning.fedbss]; weight mode, classification).
    local_policy: str = "plain"
    #: This node's cache group (a data distribution, an area: "site-3"), signed into every
    #: entry it publishes; None: its entries name none. See peerd.protocol.entry.group_problem.
    group: str | None = None
    #: The most cache places the entries of one group may hold (peerd.core.cache: each
    #: group's freshest first, entries without a group fill the rest); None: the C freshest.
    capacity_per_group: int | None = None
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    cordial: CordialConfig = field(default_factory=CordialConfig)
    fedbss: FedBSSConfig = field(default_factory=FedBSSConfig)

    def __post_init__(self) -> None:
        # A mode given by its name (Python callers, dataclasses.replace) is the enum too, so
        # that every `mode is ModeName.X` holds for it.
        object.__setattr__(self, "mode", ModeName(self.mode))

    @property
    def alpha_policy(self) -> AlphaPolicy:
        return AlphaPolicy.parse(self.alpha)

    @property
    def silence_limit_s(self) -> float:
        """``max_silence_s`` in force: half of τ_max unless set, so a republished entry has
        the other half of τ_max (rounds and gossip sweeps) to reach peers before the last
        one expires there."""
        return self.tau_max / 2 if self.max_silence_s is None else self.max_silence_s


SHARED_CHECKS: dict[str, Check] = {
    "tau_max": check_float(0.0), "staleness": check_staleness,
    "capacity": check_int(0, lim.MAX_CAPACITY), "rho": check_float(0.0),
    "local_steps": check_int(0),
    "batch_size": check_int(1), "lr": check_float(0.0, strict=True), "alpha": check_alpha,
    "epsilon": check_float(0.0), "round_interval_s": check_float(lim.MIN_ROUND_INTERVAL_S),
    "max_silence_s": check_optional(check_float(0.0, strict=True)),
    "mode": check_mode_name, "sample_capacity": check_int(1), "blend": check_blend,
    "local_policy": check_choice("plain", "fedbss"),
    "group": check_optional(check_group),
    "capacity_per_group": check_optional(check_int(1, lim.MAX_CAPACITY)),
}
#: Each table of ``[learning]``: its dataclass and the check of every key.
TABLES: dict[str, tuple[type[Any], dict[str, Check]]] = {
    "knowledge": (KnowledgeConfig, {
        "key_dim": check_int(1, MAX_KEY_DIM), "beta": check_float(0.0),
        "temperature": check_float(0.0, strict=True), "neighbours": check_int(1),
        "form": check_choice("eq18", "code"),
        "round1_knowledge": check_choice("zero", "none"),
    }),
    "cordial": (CordialConfig, {
        "images_per_digit": check_int(1, lim.MAX_CORDIAL_IMAGES_PER_DIGIT),
        "coordination": check_bool, "warmup_epochs": check_int(0),
        "bucket_s": check_float(0.0, strict=True),
        "window": check_int(lim.MIN_CORDIAL_WINDOW, lim.MAX_CORDIAL_WINDOW),
    }),
    "fedbss": (FedBSSConfig, {
        "warmup_rounds": check_int(0), "epochs": check_int(1, lim.MAX_FEDBSS_EPOCHS),
        "regrow": check_float(0.0), "steps": check_int(0, lim.MAX_FEDBSS_STEPS),
    }),
}
#: The flat ``[learning]`` keys read for one release: old key -> (table, its key there).
DEPRECATED: dict[str, tuple[str, str]] = {
    "key_dim": ("knowledge", "key_dim"),
    "distill_beta": ("knowledge", "beta"),
    "distill_temperature": ("knowledge", "temperature"),
    "distill_r": ("knowledge", "neighbours"),
    "cordial_images_per_digit": ("cordial", "images_per_digit"),
    "cordial_coordination": ("cordial", "coordination"),
    "cordial_warmup_epochs": ("cordial", "warmup_epochs"),
    "cordial_bucket_s": ("cordial", "bucket_s"),
    "cordial_window": ("cordial", "window"),
    "fedbss_warmup_rounds": ("fedbss", "warmup_rounds"),
    "fedbss_epochs": ("fedbss", "epochs"),
    "fedbss_regrow": ("fedbss", "regrow"),
    "fedbss_steps": ("fedbss", "steps"),
}

# A check per dataclass field and vice versa: a field without a check (or a check for a
# field that does not exist) would be a silent hole in the validation.
assert {f.name for f in fields(LearningConfig)} == set(SHARED_CHECKS) | set(TABLES)
for _name, (_cls, _checks) in TABLES.items():
    assert {f.name for f in fields(_cls)} == set(_checks), _name
assert all(new in TABLES[table][1] for table, new in DEPRECATED.values())


# ---------------------------------------------------------------------------- reading


def read_learning(raw: Any) -> tuple[LearningConfig, list[str]]:
    """``[learning]`` and its tables; the deprecation notices of the flat keys it read."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[learning] must be a table, got {shown(raw)}")
    unknown = sorted(set(raw) - set(SHARED_CHECKS) - set(TABLES) - set(DEPRECATED))
    if unknown:
        raise ConfigError(f"[learning] {unknown[0]}: unknown key (known: "
                          f"{', '.join(sorted(SHARED_CHECKS))}; tables: "
                          f"{', '.join(f'[learning.{t}]' for t in TABLES)})")
    values = check_table("[learning]", {k: v for k, v in raw.items() if k in SHARED_CHECKS},
                         SHARED_CHECKS)
    notices: list[str] = []
    for name, (cls, checks) in TABLES.items():
        table = raw.get(name, {})
        parsed = check_table(f"[learning.{name}]", table, checks)
        for old, (section, new) in DEPRECATED.items():
            if section != name or old not in raw:
                continue
            if new in table:
                raise ConfigError(f"[learning] {old} and [learning.{name}] {new} are one "
                                  f"setting: keep [learning.{name}] {new} only")
            parsed[new] = check_value(f"[learning] {old}", checks[new], raw[old])
            notices.append(f"[learning] {old} is deprecated: use [learning.{name}] {new}")
        values[name] = cls(**parsed)
    if ModeName(values.get("mode", ModeName.WEIGHTS)) is ModeName.KNOWLEDGE:
        values = {**{k: v for k, v in KNOWLEDGE_DEFAULTS.items() if k not in raw}, **values}
    return LearningConfig(**values), notices


def settle_mode(learning: LearningConfig, task: TaskConfig, *,
                task_named: bool) -> tuple[LearningConfig, TaskConfig, list[str]]:
    """The sensors are ``mode = "sensors"``, whose task is ``sensors``: ``[task] name`` may be
    left out. The old form (``mode = "cordial"`` with ``[task] name = "sensors"``) becomes it,
    with a deprecation notice. ``task_named``: the file sets ``[task] name``."""
    if learning.mode is ModeName.CORDIAL and task.name == SENSOR_TASK:
        return replace(learning, mode=ModeName.SENSORS), task, [
            '[learning] mode = "cordial" with [task] name = "sensors" is deprecated: use '
            '[learning] mode = "sensors" (and leave [task] name out)']
    if learning.mode is ModeName.SENSORS:
        if not task_named:
            return learning, replace(task, name=SENSOR_TASK), []
        if task.name != SENSOR_TASK:
            raise ConfigError('[task] name: mode = "sensors" trains on the time-bucket sensors '
                              f"(leave name out), got {task.name!r}")
    elif task.name == SENSOR_TASK:
        raise ConfigError('[task] name: "sensors" runs in [learning] mode = "sensors" only '
                          "(its labels depend on the other nodes' inputs)")
    return learning, task, []


# ---------------------------------------------------------------------------- checks


def check_learning(learning: LearningConfig, task: TaskConfig) -> None:
    """What ``[learning]``'s keys require of each other and of the task: the shared ones,
    then the local policy's, then the mode's (:data:`MODE_CHECKS`)."""
    if learning.max_silence_s is not None and learning.max_silence_s >= learning.tau_max:
        # A silence of tau_max lets the last entry expire at every peer before the next one
        # is even made: the node drops out of the fleet's blends in between.
        raise ConfigError(f"[learning] max_silence_s: must be < tau_max ({learning.tau_max:g})"
                          f", got {learning.max_silence_s:g}")
    if learning.capacity_per_group is not None and learning.capacity_per_group > learning.capacity:
        raise ConfigError(f"[learning] capacity_per_group: must be <= capacity "
                          f"({learning.capacity}), got {learning.capacity_per_group}")
    if learning.blend.startswith("krum"):
        f = parse_rule(learning.blend)
        assert isinstance(f, Krum)
        if learning.capacity + 1 <= 2 * f.f + 2:
            raise ConfigError(f"[learning] blend: {learning.blend} needs more than 2f + 2 = "
                              f"{2 * f.f + 2} models, but capacity {learning.capacity} + the own "
                              "model can never hold that many")
    if learning.local_steps == 0 and learning.mode is not ModeName.KNOWLEDGE:
        raise ConfigError(f"[learning] local_steps: 0 (one local epoch) is for mode = "
                          f'"knowledge" only; mode = "{learning.mode.value}" needs >= 1')
    if learning.local_policy == "fedbss":
        _check_fedbss(learning, task)
    MODE_CHECKS[learning.mode](learning, task)


def _regression(task: TaskConfig) -> bool:
    return task.name == "csv" and task.csv_kind == "regression"


def _check_fedbss(learning: LearningConfig, task: TaskConfig) -> None:
    """``local_policy = "fedbss"``: a weight-mode classification task."""
    if learning.mode is ModeName.KNOWLEDGE:
        raise ConfigError('[learning] local_policy: "fedbss" needs mode = "weights" '
                          '(knowledge mode trains by distillation)')
    if _regression(task):
        raise ConfigError('[learning] local_policy: "fedbss" needs a classification task '
                          '(it scores samples by their true class), got [task] csv_kind = '
                          '"regression"')


def _check_weights(learning: LearningConfig, task: TaskConfig) -> None:
    """Weight mode runs with every other setting."""


def _check_knowledge(learning: LearningConfig, task: TaskConfig) -> None:
    """FedCache: per-sample class logits, no model averaged, two entries per origin."""
    if _regression(task):
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
                          f"(a Digest lists two entries per origin), got {learning.capacity}")


def _check_cordial(learning: LearningConfig, task: TaskConfig) -> None:
    """Cordial (Pairwise-10) and sensors: one agent per node, a view per peer agent."""
    sensors = learning.mode is ModeName.SENSORS
    mode = f'mode = "{learning.mode}"'
    agents = task.node_count
    if not sensors and task.name not in ("digits", "mnist"):
        raise ConfigError('[task] name: mode = "cordial" runs Pairwise-10 composites of '
                          'scikit-learn digits or MNIST; set name = "digits" or "mnist" '
                          '(time-bucket sensors: [learning] mode = "sensors")')
    if task.name == "digits" and \
            learning.cordial.images_per_digit > lim.MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT:
        raise ConfigError(f"[learning.cordial] images_per_digit: at most "
                          f"{lim.MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT} with [task] name = "
                          f'"digits" (its rarest test digit has that many images), got '
                          f"{learning.cordial.images_per_digit}")
    if agents < 2 or (agents % 2 and not sensors):
        raise ConfigError(f"[task] node_count: {mode} needs " + (
            ">= 2 agents" if sensors else "an even number of agents >= 2 (digit pairs)") +
            f", got {agents}")
    cordial = learning.cordial
    if sensors and ring_slack(cordial.window, learning.tau_max,
                              cordial.bucket_s) < 0:  # an old id read as a new bucket
        raise ConfigError(f"[learning.cordial] window: {cordial.window} buckets plus "
                          f"tau_max / bucket_s = {learning.tau_max:g} / {cordial.bucket_s:g} "
                          f"must stay under {VIEW_IDS} bucket ids")
    if learning.group is not None:
        raise ConfigError(f"[learning] group: set by {mode} (agent-<node_index>), leave it out")
    if learning.capacity < agents - 1:
        raise ConfigError(f"[learning] capacity: must be >= node_count - 1 = {agents - 1} in "
                          f"{mode} (one view per peer agent), got {learning.capacity}")
    if learning.blend != "weighted" or learning.epsilon > 0 or \
            learning.local_policy != "plain":
        raise ConfigError(f"[learning] blend, epsilon, local_policy: {mode} averages no "
                          "models; leave them at their defaults")


#: The blend and local policy a mode runs whatever ``[learning]`` says (its check keeps
#: those keys at their defaults there): None where the configured ones run.
_FIXED: dict[ModeName, tuple[str, str] | None] = {
    ModeName.WEIGHTS: None,
    ModeName.KNOWLEDGE: ("none", "distillation"),  # core.round: blend none, Distillation
    ModeName.CORDIAL: ("none", "two-time-scale"),  # core.cordial: agents, no model average
    ModeName.SENSORS: ("none", "two-time-scale"),
}


def what_runs(learning: LearningConfig) -> tuple[ModeName, str, str]:
    """The mode, blend rule and local policy a checked config runs (what the status says)."""
    fixed = _FIXED[learning.mode]
    blend, policy = fixed if fixed is not None else (learning.blend, learning.local_policy)
    return learning.mode, blend, policy


#: What each mode requires of the other settings: one function per mode, in this module only.
MODE_CHECKS: dict[ModeName, Callable[[LearningConfig, TaskConfig], None]] = {
    ModeName.WEIGHTS: _check_weights,
    ModeName.KNOWLEDGE: _check_knowledge,
    ModeName.CORDIAL: _check_cordial,
    ModeName.SENSORS: _check_cordial,
}
assert set(MODE_CHECKS) == set(ModeName)
