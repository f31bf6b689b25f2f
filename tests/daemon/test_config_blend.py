"""[learning] blend: the robust rules' spellings, their errors, and the Krum capacity check."""

from __future__ import annotations

import pytest

from peerd.core.robust import Clipped, Krum
from peerd.core.round import BlendPolicy, parse_blend
from peerd.daemon.config import ConfigError, loads_config
from tests.daemon.test_config import doc


def test_blend_defaults_to_weighted_and_accepts_each_rule() -> None:
    assert loads_config(doc()).learning.blend == "weighted"
    assert parse_blend(loads_config(doc()).learning.blend) is BlendPolicy.WEIGHTED
    for spec in ("median", "trimmed", "trimmed:0.2", "clipped", "krum", "krum:2"):
        assert loads_config(doc(learning={"blend": spec})).learning.blend == spec
    assert parse_blend(loads_config(doc(learning={"blend": "clipped:2.5"})).learning.blend) \
        == Clipped(2.5)


@pytest.mark.parametrize(("spec", "message"), [
    ("krum:x", r"\[learning\] blend: bad blend rule: krum:f needs an integer f >= 0, got 'x'"),
    ("krum:-1", r"krum:f needs an integer f >= 0, got -1"),
    ("trimmed:0.6", r"trimmed: beta must be in \[0, 0.5\)"),
    ("clipped:-1", r"clipped: tau must be finite and > 0"),
    ("mean", r"unknown blend rule 'mean'"),
])
def test_bad_blend_values_name_the_key(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        loads_config(doc(learning={"blend": spec}))


def test_krum_that_the_capacity_can_never_satisfy_is_refused() -> None:
    # capacity 3 + own = 4 models; krum:1 needs more than 4.
    with pytest.raises(ConfigError, match=r"\[learning\] blend: krum:1 needs more than "
                                          r"2f \+ 2 = 4 models, but capacity 3"):
        loads_config(doc(learning={"blend": "krum:1", "capacity": 3}))
    assert parse_blend(loads_config(doc(learning={"blend": "krum:1", "capacity": 4}))
                       .learning.blend) == Krum(1)


def test_knowledge_mode_refuses_a_robust_blend() -> None:
    with pytest.raises(ConfigError, match=r'\[learning\] blend: must be "weighted" in mode'):
        loads_config(doc(learning={"mode": "knowledge", "blend": "median"},
                         task={"name": "digits"}))
