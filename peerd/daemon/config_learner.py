"""The ``[learner]`` section: who trains the node's model in weight mode.

```toml
[learner]
kind = "python"                 # builtin (default) | python | flower | external
entry = "mypkg.train:learner"   # python: a learner or a factory; flower: a ClientApp/client_fn
model = "mypkg.net:Net"         # the fleet's initial model, built seeded on every node
device = "auto"                 # auto | cpu | cuda | cuda:N | mps
timeout_s = 600                 # a fit (or evaluation) that runs longer is cut
python = "/opt/flower/bin/python"  # optional: the worker's interpreter (another venv)
[learner.run_config]            # scalars: the learner's own settings
[learner.node_config]           # scalars: this node's (Flower's "partition-id", ...)
```

What the keys require of each other and of the other sections is checked here too: ``entry``
and ``model`` for the python and flower kinds (and only for them; external: ``model`` and
no ``entry``, ``python`` or ``timeout_s``), weight mode only for any
kind but builtin, no ``[task]`` beside one (the learner reads its own data and ``model``
builds the model), no FedBSS (a built-in curriculum). Whether the device exists is known
only to torch, which this module must not import (``peerd status`` loads it): the daemon
checks it at start-up (:func:`peerd.learn.learner.device.resolve_device`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from peerd.core.modes import ModeName
from peerd.daemon.config_checks import (
    BadValueError,
    Check,
    ConfigError,
    check_choice,
    check_float,
    check_optional,
    check_table,
    shown,
)

#: ``[learner] kind``: the values of peerd.learn.learner.contract.LearnerKind (a test holds
#: them equal; that module imports torch, this one must not).
KINDS = ("builtin", "python", "flower", "external")
#: The kinds that run the user's code in a worker process and need ``entry`` and ``model``.
WORKER_KINDS = ("python", "flower")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d{1,3})?)$")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: Bounds on ``[learner.run_config]`` / ``[learner.node_config]``: they travel to the worker
#: in one control message (peerd.learn.learner.wire.MAX_FRAME) every round.
MAX_CONFIG_KEYS = 64
MAX_CONFIG_KEY_LEN = 64
MAX_CONFIG_TEXT_LEN = 1024

Scalar = bool | int | float | str


@dataclass(frozen=True, slots=True)
class LearnerConfig:
    kind: str = "builtin"
    #: ``package.module:attr``: the learner (python) or the Flower app (flower).
    entry: str | None = None
    #: ``package.module:callable``: builds the fleet's model, seeded with the fleet seed.
    model: str | None = None
    #: auto | cpu | cuda | cuda:N | mps; auto: the first CUDA device if any, else the CPU.
    device: str = "auto"
    timeout_s: float = 600.0
    #: The worker's interpreter (an absolute path), when the learner's dependencies live in
    #: an environment of their own (Flower's pins do not resolve beside peerd's: see
    #: docs/learners.md); None: the daemon's own. That environment must have peerd installed.
    python: str | None = None
    run_config: Mapping[str, Scalar] = field(default_factory=dict)
    node_config: Mapping[str, Scalar] = field(default_factory=dict)

    @property
    def runs_worker(self) -> bool:
        """The user's code runs in a worker process (python, flower)."""
        return self.kind in WORKER_KINDS


def check_entry(v: Any) -> str:
    if isinstance(v, str) and _ENTRY.match(v):
        return v
    raise BadValueError(f"must be package.module:attr, got {shown(v)}")


def check_python(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("/"):
        raise BadValueError("must be the absolute path of a python interpreter")
    if not (os.path.isfile(v) and os.access(v, os.X_OK)):
        raise BadValueError(f"{v} is not an executable file")
    return v


def check_device(v: Any) -> str:
    if isinstance(v, str) and _DEVICE.match(v):
        return v
    raise BadValueError(f"must be auto, cpu, cuda, cuda:N or mps, got {shown(v)}")


def _scalar_table(section: str, raw: Any) -> dict[str, Scalar]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{section} must be a table, got {shown(raw)}")
    if len(raw) > MAX_CONFIG_KEYS:
        raise ConfigError(f"{section}: at most {MAX_CONFIG_KEYS} keys, got {len(raw)}")
    out: dict[str, Scalar] = {}
    for key, value in raw.items():
        if len(key) > MAX_CONFIG_KEY_LEN:
            raise ConfigError(f"{section} {key[:MAX_CONFIG_KEY_LEN]}…: a key holds at most "
                              f"{MAX_CONFIG_KEY_LEN} characters")
        ok = isinstance(value, bool | int | str) or (isinstance(value, float)
                                                     and math.isfinite(value))
        if not ok:
            got = "a table" if isinstance(value, Mapping) else (
                "a list" if isinstance(value, list) else shown(value))
            raise ConfigError(f"{section} {key}: must be a boolean, a finite number or a "
                              f"string, got {got}")
        if isinstance(value, str) and len(value) > MAX_CONFIG_TEXT_LEN:
            raise ConfigError(f"{section} {key}: a string holds at most "
                              f"{MAX_CONFIG_TEXT_LEN} characters")
        out[key] = value
    return out


LEARNER_CHECKS: dict[str, Check] = {
    "kind": check_choice(*KINDS), "entry": check_optional(check_entry),
    "model": check_optional(check_entry), "device": check_device,
    "timeout_s": check_float(0.0, strict=True), "python": check_optional(check_python),
}
#: The tables inside ``[learner]``.
SUBTABLES = ("run_config", "node_config")


def read_learner(raw: Any) -> LearnerConfig:
    """``[learner]`` (with its ``run_config`` and ``node_config`` tables), each key checked."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[learner] must be a table, got {shown(raw)}")
    flat = {k: v for k, v in raw.items() if k not in SUBTABLES}
    known = {**LEARNER_CHECKS, **dict.fromkeys(SUBTABLES, check_optional(lambda v: v))}
    unknown = sorted(set(flat) - set(known))
    if unknown:
        raise ConfigError(f"[learner] {unknown[0]}: unknown key "
                          f"(known: {', '.join(sorted(known))})")
    values = check_table("[learner]", flat, LEARNER_CHECKS)
    tables: dict[str, Any] = {name: _scalar_table(f"[learner.{name}]", raw[name])
              for name in SUBTABLES if name in raw}
    learner = LearnerConfig(**values, **tables)
    kind = learner.kind
    if kind == "external":
        # The daemon holds, blends and signs the fleet's model; the user's process trains it.
        if learner.model is None:
            raise ConfigError('[learner] model: required with kind = "external" (the fleet\'s '
                              "model, a callable returning an nn.Module, package.module:attr)")
        for key in ("entry", "python", "timeout_s"):
            if key in flat:
                raise ConfigError(f'[learner] {key}: not used with kind = "external" (the '
                                  "training process is the user's own; it attaches to the "
                                  "daemon's learner socket)")
    elif learner.runs_worker:
        for key in ("entry", "model"):
            if getattr(learner, key) is None:
                what = ("the learner (or its factory)" if key == "entry" and kind == "python"
                        else "the Flower ClientApp or client_fn" if key == "entry"
                        else "the fleet's model, a callable returning an nn.Module")
                raise ConfigError(f'[learner] {key}: required with kind = "{kind}" ({what}, '
                                  "package.module:attr)")
    else:
        for key in ("entry", "model", "python"):
            if getattr(learner, key) is not None:
                raise ConfigError(f'[learner] {key}: only with kind = "python" or "flower", '
                                  f'not "{kind}"')
    return learner


def check_learner(learner: LearnerConfig, *, mode: ModeName, local_policy: str,
                  task_given: bool) -> None:
    """What ``[learner]`` requires of ``[learning]`` and ``[task]``."""
    kind = learner.kind
    if kind == "builtin":
        if mode is not ModeName.WEIGHTS and learner.device not in ("auto", "cpu"):
            # Not silently ignored: only weight mode's local step runs on a device.
            raise ConfigError(f'[learner] device: "{learner.device}" is for weight mode\'s '
                              f'local step; [learning] mode = "{mode}" trains on the CPU')
        return
    if mode is not ModeName.WEIGHTS:
        raise ConfigError(f'[learner] kind: "{kind}" trains weight mode\'s local step; '
                          f'[learning] mode = "{mode}" trains with its own learner (use '
                          'kind = "builtin", or mode = "weights")')
    if local_policy != "plain":
        raise ConfigError(f'[learning] local_policy: "{local_policy}" is the builtin '
                          f'learner\'s curriculum; with [learner] kind = "{kind}" it must be '
                          '"plain"')
    if task_given:
        raise ConfigError(f'[task]: not used with [learner] kind = "{kind}" (the learner '
                          "reads its own data and [learner] model builds the model); leave "
                          "it out ([learner.node_config] carries per-node settings)")
