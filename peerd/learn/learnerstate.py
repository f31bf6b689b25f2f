"""A local learner's state to and from its file: torch modules and Adam's moments as tensors.

Knowledge and cordial mode keep what they learned in the state directory's learner file
(peerd.store.learnerfile owns its format and decides whether a saved one fits). This module is
the torch side: a module's ``state_dict`` and an Adam optimiser's per-parameter state as named
numpy arrays (bfloat16 as its uint16 words, as entries carry it), their expected schema, and
copying a saved state back into a live learner in place. :class:`KnowledgeLearner` is
knowledge mode's learner (its model: plain SGD keeps no other state; each round's seed comes
from the persisted round counter); cordial mode's is
:class:`peerd.learn.cordialround.CordialLearner`. :func:`restore` and :func:`save` are what
the daemon's modes call. Must not touch the node state, the network or the file format.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from peerd.core.entry import Schema as ModelSchema
from peerd.core.entry import dtype_name
from peerd.node.wirearrays import to_wire_arrays, wire_schema
from peerd.store import learnerfile
from peerd.store.learnerfile import Identity, LearnerState
from peerd.store.statedir import StateDir

log = logging.getLogger(__name__)

#: Largest |value| a restored learner's parameters may hold. Threat: a learner that diverged
#: (a poisoned peer view took a sensor agent's Λ_j^i to 5e63, issue 24) is saved every round
#: and would come back diverged after each restart; healthy agents' weights are O(1) (a
#: trained sensor agent's M_i ≤ 1.5, Λ ≤ 0.4; LeNet weights < 1), so 1e4 is only reached by
#: one that left its problem's scale for good.
MAX_PARAM_ABS = 1e4

#: Adam's per-parameter state (amsgrad off): its step and the two moments.
ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")

Arrays = dict[str, npt.NDArray[Any]]
SchemaDict = dict[str, tuple[str, tuple[int, ...]]]


class Learner(Protocol):
    """What :func:`restore` and :func:`save` need of a mode's learner."""

    mode: str

    def identity(self) -> Identity: ...
    def expected(self, counts: Mapping[str, int]) -> SchemaDict: ...
    def snapshot(self, round_no: int) -> LearnerState: ...
    def load(self, saved: LearnerState) -> None: ...


# ---------------------------------------------------------------------------- pieces


def module_arrays(prefix: str, module: nn.Module) -> tuple[Arrays, set[str]]:
    """``module``'s state_dict as arrays named ``prefix + name`` (views of the live tensors),
    and which of them are bfloat16."""
    arrays, bf16 = to_wire_arrays(module.state_dict())
    return ({prefix + k: v for k, v in arrays.items()}, {prefix + k for k in bf16})


def module_schema(prefix: str, module: nn.Module) -> SchemaDict:
    schema = wire_schema(ModelSchema.of(module.state_dict()))
    return {prefix + k: v for k, v in schema.items()}


def _tensor(saved: LearnerState, name: str) -> torch.Tensor:
    """A writable torch copy of the saved array ``name``."""
    t = torch.from_numpy(np.array(saved.tensors[name], copy=True))
    return t.view(torch.bfloat16) if name in saved.bfloat16 else t


def load_module(prefix: str, module: nn.Module, saved: LearnerState) -> None:
    """Copy the saved tensors into ``module``'s parameters and buffers, in place."""
    with torch.no_grad():
        for name, t in module.state_dict().items():
            t.copy_(_tensor(saved, prefix + name))


def _step_dtype() -> torch.dtype:
    # The dtype torch.optim.Adam gives ``state["step"]`` (float32 unless float64 is default).
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def adam_arrays(prefix: str, opt: torch.optim.Optimizer,
                names: Mapping[int, str]) -> tuple[Arrays, set[str]]:
    """The optimiser's per-parameter state as ``prefix + param name + "." + key`` arrays;
    ``names`` maps ``id(param)`` to the parameter's name."""
    tensors = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for key, value in opt.state.get(p, {}).items():
                tensors[f"{prefix}{names[id(p)]}.{key}"] = value
    arrays, bf16 = to_wire_arrays(tensors)
    return arrays, set(bf16)


def adam_schema(prefix: str, named: Mapping[str, nn.Parameter]) -> SchemaDict:
    """What :func:`adam_arrays` gives once every parameter took a step."""
    out: SchemaDict = {}
    for name, p in named.items():
        moment = (dtype_name(p.dtype), tuple(p.shape))
        out[f"{prefix}{name}.exp_avg"] = out[f"{prefix}{name}.exp_avg_sq"] = moment
        out[f"{prefix}{name}.step"] = (dtype_name(_step_dtype()), ())
    return out


def load_adam(prefix: str, opt: torch.optim.Optimizer, names: Mapping[int, str],
              saved: LearnerState) -> None:
    """Replace the optimiser's per-parameter state with the saved one (copies)."""
    state = opt.state_dict()
    params = [p for group in opt.param_groups for p in group["params"]]
    state["state"] = {i: {key: _tensor(saved, f"{prefix}{names[id(p)]}.{key}")
                          for key in ADAM_KEYS}
                      for i, p in enumerate(params)}
    opt.load_state_dict(state)


def check_not_exploded(name: str, a: npt.NDArray[Any]) -> None:
    """ValueError if a saved parameter is beyond :data:`MAX_PARAM_ABS` (NaN is refused
    earlier, by peerd.store.learnerfile; bfloat16 words and integers are not checked)."""
    if a.size and a.dtype.kind == "f":
        peak = float(np.max(np.abs(a)))
        if not peak <= MAX_PARAM_ABS:
            raise ValueError(f"{name} reaches |{peak:.3g}| > {MAX_PARAM_ABS:g}: the learner "
                             f"had diverged")


# ---------------------------------------------------------------------------- knowledge mode


class KnowledgeLearner:
    """Knowledge mode's learner: the node's model, trained in place by the knowledge round."""

    mode = "knowledge"

    def __init__(self, model: nn.Module, *, task: str, model_name: str | None) -> None:
        self.model = model
        self._identity: dict[str, str | int] = {"task": task, "model": model_name or ""}

    def identity(self) -> Identity:
        return self._identity

    def expected(self, counts: Mapping[str, int]) -> SchemaDict:
        return module_schema("model.", self.model)

    def snapshot(self, round_no: int) -> LearnerState:
        arrays, bf16 = module_arrays("model.", self.model)
        return LearnerState(self.mode, self._identity, round_no, {}, arrays, frozenset(bf16))

    def load(self, saved: LearnerState) -> None:
        load_module("model.", self.model, saved)


# ---------------------------------------------------------------------------- the daemon's calls


def restore(state_dir: StateDir, learner: Learner) -> int | None:
    """Load the saved learner into ``learner`` if it fits (peerd.store.learnerfile decides and
    logs why not); the round it was saved after, or None when it starts fresh."""
    saved = learnerfile.load(state_dir, mode=learner.mode, identity=learner.identity(),
                             expected=learner.expected)
    if saved is None:
        return None
    try:
        learner.load(saved)
    except (ValueError, RuntimeError) as exc:
        # The learner checks values before it changes anything: it is still the fresh one.
        # A state of this very learner it cannot take is corrupt: set aside, not retried.
        learnerfile.refuse(state_dir, saved.round, str(exc))
        return None
    log.info("restored the local learner (%s mode) at round %d", learner.mode, saved.round)
    state_dir.audit("learner_restored", mode=learner.mode, round=saved.round)
    return saved.round


def save(state_dir: StateDir, learner: Learner, round_no: int) -> bool:
    """Save ``learner`` after round ``round_no`` (a worker thread, between rounds). A failure
    is logged and returns False: learning goes on."""
    try:
        state = learner.snapshot(round_no)
    except ValueError as exc:  # a dtype the codec does not carry
        log.error("cannot save the local learner (%s); it keeps learning in memory", exc)
        return False
    return learnerfile.save(state_dir, state)
