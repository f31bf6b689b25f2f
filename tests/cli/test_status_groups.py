"""`peerd status`: a group column once a cached entry names a group (none otherwise); the gossip
line."""

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


def test_the_gossip_line_shows_sweeps_and_the_fanout_bound_once_a_sweep_ran() -> None:
    s = sample_status()
    assert "sweeps" not in rendered(dataclasses.replace(s, gossip={}))
    text = rendered(dataclasses.replace(s, gossip={
        "sweeps": 12, "dials": 31, "most_dials_in_a_sweep": 3, "most_outbound_at_once": 2}))
    assert "gossip: 12 sweeps, 31 sessions started (most in one sweep 3, most at once 2)" \
        in " ".join(text.split())
