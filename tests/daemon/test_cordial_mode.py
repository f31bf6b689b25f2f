"""Cordial mode's wiring pieces: the agent named by a view's signed group, and the view schema
every node of a cordial fleet must agree on."""

from __future__ import annotations

import pytest

from peerd.daemon.modes.cordial import agent_group, agent_of, view_schema
from peerd.learn.cordialround import WIDTH, index_size


@pytest.mark.parametrize(("group", "agent"), [
    ("agent-0", 0), ("agent-7", 7), ("agent-1234", 1234),
    (None, None), ("", None), ("agent-", None), ("agent-x", None), ("agent-12345", None),
    ("site-3", None), ("agent-1 ", None), ("xagent-1", None),
])
def test_a_view_names_its_agent_by_its_group(group: str | None, agent: int | None) -> None:
    assert agent_of(group) == agent


def test_agent_groups_round_trip() -> None:
    assert [agent_of(agent_group(i)) for i in range(4)] == [0, 1, 2, 3]


def test_every_agent_of_a_fleet_computes_one_view_schema() -> None:
    schema = view_schema(4, 25, 7)
    assert (schema.key_dim, schema.num_classes) == (WIDTH, 10)
    assert schema.view_ids == schema.max_samples == index_size(25) == 675
    assert view_schema(4, 25, 7).id == schema.id  # no agent index in it: fleet-wide
    # Another shared index (agents, P or seed) is another schema: refused as schema_mismatch.
    assert len({schema.id, view_schema(6, 25, 7).id, view_schema(4, 10, 7).id,
                view_schema(4, 25, 8).id, view_schema(4, 25, 7, "digits").id}) == 5
    # MNIST's schema is the one it was before the digits source existed.
    assert view_schema(4, 25, 7, "mnist") == schema
    assert schema.encoder == "cordial-pairwise10/v1 agents=4 p=25 seed=7"
