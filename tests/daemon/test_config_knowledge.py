"""``[learning] mode`` and ``[learning.knowledge]``, ``[task] model``: parsed, validated, named."""

from __future__ import annotations

from typing import Any

import pytest

from peerd.core.modes import ModeName
from peerd.daemon.config import ConfigError, loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX


def doc(**sections: dict[str, Any]) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX}, **sections}


def test_defaults_are_weight_mode_and_the_tasks_model() -> None:
    cfg = loads_config(doc())
    assert (cfg.learning.mode, cfg.task.model) == ("weights", None)
    assert (cfg.learning.knowledge.key_dim, cfg.learning.knowledge.neighbours) == (64, 16)


def test_knowledge_mode_with_a_model_per_node() -> None:
    knowledge = {"key_dim": 32, "beta": 0.0, "temperature": 1.5, "neighbours": 4}
    cfg = loads_config(doc(learning={"mode": "knowledge", "sample_capacity": 5000,
                                     "knowledge": knowledge},
                           task={"model": "small"}))
    assert cfg.learning.mode is ModeName.KNOWLEDGE
    assert cfg.deprecations == ()
    k = cfg.learning.knowledge
    assert (k.key_dim, k.beta, k.temperature, k.neighbours) == (32, 0.0, 1.5, 4)
    assert cfg.learning.sample_capacity == 5000
    assert cfg.task.model == "small"
    assert loads_config(doc(task={"model": "mypkg.models:tiny"})).task.model == \
        "mypkg.models:tiny"


@pytest.mark.parametrize(("sections", "message"), [
    ({"learning": {"mode": "logits"}}, "[learning] mode: must be one of weights, knowledge, "
                                       "cordial, sensors, got 'logits'"),
    ({"task": {"model": "huge"}}, "[task] model: must be one of small, medium, large"),
    ({"task": {"model": "not a module"}}, "[task] model:"),
    ({"learning": {"knowledge": {"key_dim": 0}}},
     "[learning.knowledge] key_dim: must be an integer in [1, 512]"),
    ({"learning": {"knowledge": {"key_dim": 513}}},
     "[learning.knowledge] key_dim: must be an integer in [1, 512]"),
    ({"learning": {"knowledge": {"neighbours": 0}}},
     "[learning.knowledge] neighbours: must be an integer >= 1"),
    ({"learning": {"knowledge": {"temperature": 0}}}, "[learning.knowledge] temperature: must"),
    ({"learning": {"knowledge": {"beta": -1}}}, "[learning.knowledge] beta: must be"),
    ({"learning": {"knowledge": {"distill_beta": 1.0}}},
     "[learning.knowledge] distill_beta: unknown key (known: beta, form, key_dim, neighbours, "
     "round1_knowledge, "
     "temperature)"),
    ({"learning": {"knowledge": 3}}, "[learning.knowledge] must be a table, got 3"),
    # The deprecated flat spellings are checked as before, named as written.
    ({"learning": {"key_dim": 0}}, "[learning] key_dim: must be an integer in [1, 512]"),
    ({"learning": {"distill_r": 0}}, "[learning] distill_r: must be an integer >= 1"),
    ({"learning": {"distill_temperature": 0}}, "[learning] distill_temperature: must be"),
    ({"learning": {"distill_beta": -1}}, "[learning] distill_beta: must be"),
    ({"learning": {"sample_capacity": 0}}, "[learning] sample_capacity: must be"),
    ({"learning": {"mode": "knowledge", "epsilon": 0.5}}, "[learning] epsilon: must be 0"),
    ({"learning": {"mode": "knowledge", "capacity": 256}}, "[learning] capacity: at most 255"),
    ({"learning": {"mode": "knowledge"},
      "task": {"name": "csv", "csv_glob": "/x/*.csv", "csv_kind": "regression"}},
     '[learning] mode: "knowledge" needs a classification task'),
])
def test_bad_values_name_the_key(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(doc(**sections))
    assert message in str(info.value)


def test_the_flat_knowledge_keys_still_work_with_a_notice_each() -> None:
    flat = loads_config(doc(learning={"mode": "knowledge", "key_dim": 32, "distill_beta": 0.0,
                                      "distill_temperature": 1.5, "distill_r": 4}))
    nested = loads_config(doc(learning={"mode": "knowledge", "knowledge": {
        "key_dim": 32, "beta": 0.0, "temperature": 1.5, "neighbours": 4}}))
    assert flat.learning == nested.learning
    assert flat.deprecations == (
        "[learning] key_dim is deprecated: use [learning.knowledge] key_dim",
        "[learning] distill_beta is deprecated: use [learning.knowledge] beta",
        "[learning] distill_temperature is deprecated: use [learning.knowledge] temperature",
        "[learning] distill_r is deprecated: use [learning.knowledge] neighbours")


def test_a_key_in_both_spellings_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(doc(learning={"distill_beta": 1.0, "knowledge": {"beta": 2.0}}))
    assert str(info.value) == ("[learning] distill_beta and [learning.knowledge] beta are one "
                               "setting: keep [learning.knowledge] beta only")


def test_knowledge_mode_takes_the_papers_training_defaults() -> None:
    # The paper (§5.1.1, §5.1.4): one local epoch, batch 8, lr 0.01; weight mode keeps its own.
    knowledge = loads_config(doc(learning={"mode": "knowledge"})).learning
    assert (knowledge.local_steps, knowledge.batch_size, knowledge.lr) == (0, 8, 0.01)
    # eq. 18 with the form's T (peerd.core.distill: unset here, 1 when the policy is built)
    assert (knowledge.knowledge.form, knowledge.knowledge.temperature) == ("eq18", None)
    weights = loads_config(doc()).learning
    assert (weights.local_steps, weights.batch_size, weights.lr) == (10, 32, 0.05)
    # A key the file sets is the file's, in either mode.
    mine = loads_config(doc(learning={"mode": "knowledge", "lr": 0.1, "local_steps": 3,
                                      "knowledge": {"form": "code"}})).learning
    assert (mine.local_steps, mine.batch_size, mine.lr, mine.knowledge.form) == (3, 8, 0.1,
                                                                                 "code")


def test_one_epoch_steps_are_knowledge_modes_only() -> None:
    with pytest.raises(ConfigError, match=r'local_steps: 0 \(one local epoch\) is for mode = '
                                          r'"knowledge" only'):
        loads_config(doc(learning={"local_steps": 0}))
    with pytest.raises(ConfigError, match="form: must be one of eq18, code"):
        loads_config(doc(learning={"mode": "knowledge", "knowledge": {"form": "kd"}}))


def test_round1_knowledge_is_eq9s_zeros_unless_set_to_none() -> None:
    knowledge = loads_config(doc(learning={"mode": "knowledge"})).learning.knowledge
    assert knowledge.round1_knowledge == "zero"  # as peerd sim's default
    none = loads_config(doc(learning={"mode": "knowledge",
                                      "knowledge": {"round1_knowledge": "none"}}))
    assert none.learning.knowledge.round1_knowledge == "none"
    with pytest.raises(ConfigError, match="round1_knowledge: must be one of zero, none"):
        loads_config(doc(learning={"mode": "knowledge",
                                   "knowledge": {"round1_knowledge": "uniform"}}))
