"""[learning] group and capacity_per_group: defaults, valid values, one-line errors."""

from __future__ import annotations

import pytest

from peerd.daemon.config import ConfigError, loads_config
from tests.daemon.test_config import doc


def test_both_default_to_unset() -> None:
    learning = loads_config(doc()).learning
    assert learning.group is None
    assert learning.capacity_per_group is None


def test_valid_values_are_kept() -> None:
    learning = loads_config(doc(learning={"group": "ward:east-3", "capacity_per_group": 2,
                                          "capacity": 4})).learning
    assert (learning.group, learning.capacity_per_group) == ("ward:east-3", 2)
    assert loads_config(doc(learning={"group": ""})).learning.group is None  # TOML's unset


@pytest.mark.parametrize(("value", "message"), [
    ("g" * 65, r"\[learning\] group: must be 1 to 64 characters, got 65"),
    ("site 1", r"\[learning\] group: may hold only ASCII letters, digits and \. _ : -, "
               r"got 'site 1'"),
    ("a\nb", r"may hold only ASCII letters"),
    ("caf\u00e9", r"may hold only ASCII letters"),
    (3, r"\[learning\] group: must be a string, got int"),
    (["a"], r"must be a string, got list"),
])
def test_bad_groups_are_one_line_errors_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        loads_config(doc(learning={"group": value}))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("learning", "message"), [
    ({"capacity_per_group": 0}, r"\[learning\] capacity_per_group: must be an integer in "
                                r"\[1, 511\], got 0"),
    ({"capacity_per_group": 1.5}, r"must be an integer"),
    ({"capacity_per_group": True}, r"must be an integer"),
    ({"capacity_per_group": 4, "capacity": 3},
     r"\[learning\] capacity_per_group: must be <= capacity \(3\), got 4"),
])
def test_bad_quotas_are_one_line_errors_naming_the_key(
    learning: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        loads_config(doc(learning=learning))
    assert "\n" not in str(info.value)
