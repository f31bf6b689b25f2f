"""``[learning] mode`` and the knowledge settings, ``[task] model``: parsed, validated, named."""

from __future__ import annotations

from typing import Any

import pytest

from peerd.daemon.config import ConfigError, loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX


def doc(**sections: dict[str, Any]) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX}, **sections}


def test_defaults_are_weight_mode_and_the_tasks_model() -> None:
    cfg = loads_config(doc())
    assert (cfg.learning.mode, cfg.task.model) == ("weights", None)
    assert (cfg.learning.key_dim, cfg.learning.distill_r) == (64, 16)


def test_knowledge_mode_with_a_model_per_node() -> None:
    cfg = loads_config(doc(learning={"mode": "knowledge", "key_dim": 32, "distill_beta": 0.0,
                                     "distill_temperature": 1.5, "distill_r": 4,
                                     "sample_capacity": 5000},
                           task={"model": "small"}))
    assert cfg.learning.mode == "knowledge"
    assert (cfg.learning.key_dim, cfg.learning.distill_beta, cfg.learning.distill_r) == (
        32, 0.0, 4)
    assert cfg.task.model == "small"
    assert loads_config(doc(task={"model": "mypkg.models:tiny"})).task.model == \
        "mypkg.models:tiny"


@pytest.mark.parametrize(("sections", "message"), [
    ({"learning": {"mode": "logits"}}, "[learning] mode: must be one of weights, knowledge"),
    ({"task": {"model": "huge"}}, "[task] model: must be one of small, medium, large"),
    ({"task": {"model": "not a module"}}, "[task] model:"),
    ({"learning": {"key_dim": 0}}, "[learning] key_dim: must be an integer in [1, 512]"),
    ({"learning": {"key_dim": 513}}, "[learning] key_dim: must be an integer in [1, 512]"),
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
