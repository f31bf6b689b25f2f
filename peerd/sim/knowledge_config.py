"""The FedCache experiment's options (:mod:`peerd.sim.knowledge` runs them).

A leaf module: the runners (:mod:`peerd.sim.knowledge_fedcache`,
:mod:`peerd.sim.knowledge_weights`) and the driver all read the config, and nothing here
reads them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from peerd.core.distill import (
    DISTILL_FORMS,
    Distillation,
    DistillForm,
    temperature_in_force,
)

KNOWLEDGE_ALGORITHMS = ("fedcache", "isolated", "cached-dfl", "fedcache-mobility")
MIXED = ("small", "medium", "large")
#: Bytes of one float16 value on the wire (keys and logits travel as float16).
F16 = 2
LOCAL_EPOCHS = ("client", "mean")
ROUND1_KNOWLEDGE = ("zero", "none")


@dataclass(frozen=True)
class KnowledgeSimConfig:
    dataset: str = "fashion-mnist"
    agents: int = 300
    rounds: int = 50
    dirichlet: float = 1.0
    models: str = "large"  # a model name, or "mixed" (small/medium/large by index mod 3)
    algorithms: tuple[str, ...] = ("fedcache", "cached-dfl")
    lr: float = 0.01
    batch_size: int = 8
    beta: float = 1.5
    #: None: the loss form's (peerd.core.distill.DEFAULT_TEMPERATURE, 1 for eq18, 3 for
    #: code); read through :attr:`t`. The run's JSON records the T in force.
    temperature: float | None = None
    r: int = 16
    key_dim: int = 64
    seed: int = 0
    eval_every: int = 1
    distill_form: DistillForm = "eq18"  # the notes' eq. 18 (peerd.core.distill)
    local_epoch: str = "client"
    round1_knowledge: str = "zero"
    index_bytes: int = 4
    targets: tuple[float, ...] = (0.6, 0.7)
    # Cached-DFL's side (the mobility model and its cache)
    capacity: int = 10
    tau_max: float = 5.0
    round_seconds: int = 120

    @property
    def t(self) -> float:
        """The distillation temperature in force: the one set, else the loss form's."""
        return temperature_in_force(self.temperature, self.distill_form)  # bad form: validate

    def validate(self) -> None:
        bad = [a for a in self.algorithms if a not in KNOWLEDGE_ALGORITHMS]
        if bad or not self.algorithms:
            raise ValueError(f"unknown algorithm(s) {bad}; choose from "
                             f"{', '.join(KNOWLEDGE_ALGORITHMS)}")
        if self.agents < 2 or self.rounds < 1 or self.batch_size < 1 or self.eval_every < 1:
            raise ValueError("need agents >= 2 and rounds, batch size, eval-every >= 1")
        if not (self.lr > 0 and self.dirichlet > 0):
            raise ValueError("lr and the Dirichlet concentration must be > 0")
        if self.models != "mixed" and self.models not in MIXED:
            raise ValueError(f"--model must be small, medium, large or mixed in fedcache runs, "
                             f"got {self.models!r}")
        if self.distill_form not in DISTILL_FORMS:
            raise ValueError(f"--distill-form must be one of {', '.join(DISTILL_FORMS)}, got "
                             f"{self.distill_form!r}")
        if self.local_epoch not in LOCAL_EPOCHS:
            raise ValueError(f"--local-epoch must be one of {', '.join(LOCAL_EPOCHS)}, got "
                             f"{self.local_epoch!r}")
        if self.round1_knowledge not in ROUND1_KNOWLEDGE:
            raise ValueError(f"--round1-knowledge must be one of {', '.join(ROUND1_KNOWLEDGE)}"
                             f", got {self.round1_knowledge!r}")
        if self.index_bytes not in (0, 1, 2, 4, 8):
            raise ValueError(f"--index-bytes must be 0, 1, 2, 4 or 8, got {self.index_bytes}")
        if not all(0 < t <= 1 for t in self.targets):
            raise ValueError(f"--targets must be accuracies in (0, 1], got {self.targets}")
        Distillation(self.beta, self.t, self.r, self.distill_form)  # validates

    def model_of(self, agent: int) -> str:
        return MIXED[agent % 3] if self.models == "mixed" else self.models


#: ``--json``'s config block names each option as its flag (and the daemon's config) does,
#: not as the field it is kept in here.
_JSON_NAMES = {"r": "neighbours", "models": "model", "round_seconds": "round_interval_s"}


def config_json(config: KnowledgeSimConfig) -> dict[str, Any]:
    """The options of a run, under their flags' names (``--partition dirichlet:A``)."""
    out: dict[str, Any] = {}
    for name, value in asdict(config).items():
        if name == "dirichlet":
            out["partition"] = f"dirichlet:{value:g}"
        elif name == "temperature":
            out[name] = config.t  # the T in force, not "unset"
        else:
            out[_JSON_NAMES.get(name, name)] = value
    out["algorithms"] = list(config.algorithms)
    out["targets"] = list(config.targets)
    return out

