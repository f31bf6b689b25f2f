"""`peerd status`: a group column once a cached entry names a group; none otherwise."""

from __future__ import annotations

import dataclasses

from tests.cli.test_status_knowledge import rendered
from tests.daemon.helpers import sample_status


def test_a_group_column_appears_once_an_entry_names_a_group() -> None:
    s = sample_status()
    grouped = dataclasses.replace(s.cache[0], group="ward:east-3")
    plain = dataclasses.replace(s.cache[0], origin="12D3KooWother", group=None)
    text = rendered(dataclasses.replace(s, cache=(grouped, plain)))
    assert " group " in text
    assert "ward:east-3" in text


def test_without_groups_there_is_no_group_column() -> None:
    assert " group " not in rendered(sample_status())
