"""Whose view a cordial node holds (peerd.daemon.modes.cordial.view_refusal on a KnowledgeState): a
view is held only when the manifest binds its origin to the agent its group names; the others
are refused as ``agent_not_bound`` before the cache; a newer manifest that moves a binding
drops the views it no longer backs."""

from __future__ import annotations

import numpy as np
import pytest

from peerd.core.reasons import Reason
from peerd.core.validate import ValidationLimits
from peerd.daemon.modes.cordial import bind_views, view_refusal
from peerd.daemon.modes.sensors import sensor_view_schema
from peerd.node.knowstate import KnowledgeState, sign_own_view
from peerd.protocol.identity import node_id_of, public_key_bytes
from peerd.protocol.manifest import Manifest
from tests.net.test_gossip import ADMIN
from tests.node.fleet import FLEET, NOW, SCHEMA, key

VS = sensor_view_schema(3, 10.0, 4, 1)
ME, ONE, MALLORY = key(1), key(2), key(3)


def _manifest(seq: int, bindings: dict[int, int | None]) -> Manifest:
    m = Manifest(FLEET, 0)
    for n, agent in bindings.items():
        m = m.admit(public_key_bytes(key(n)), None, agent)
    return Manifest(FLEET, seq, m.members, m.revoked)


def _node(man: Manifest) -> KnowledgeState:
    node = KnowledgeState(key=ME, fleet_id=FLEET, manifest=man, schema=SCHEMA,
                          limits=ValidationLimits(), tau_max=600.0, capacity=5, knowledge=VS,
                          sample_budget=None)
    node.manifest_envelope = man.sign(ADMIN)
    bind_views(node, 0)
    return node


def _offer(node: KnowledgeState, signer: int, group: str | None, version: int) -> Reason | None:
    held = sign_own_view(key(signer), FLEET, VS, version=version, created_at=NOW,
                         ids=np.arange(4, dtype=np.int32),
                         vectors=np.ones((4, 1), dtype=np.float32), group=group)
    verified = node.verifier(held.message, None, NOW)()
    return node.accept(verified, sender=node_id_of(key(signer)), now=NOW)


def test_only_the_bound_member_speaks_for_an_agent() -> None:
    node = _node(_manifest(1, {1: 0, 2: 1, 3: None}))
    assert _offer(node, 2, "agent-1", 1) is None  # ONE is agent 1
    assert _offer(node, 3, "agent-1", 1) is Reason.AGENT_NOT_BOUND  # MALLORY is no agent
    assert _offer(node, 2, "agent-2", 2) is Reason.AGENT_NOT_BOUND  # ONE is not agent 2
    assert _offer(node, 3, None, 2) is Reason.AGENT_NOT_BOUND  # names no agent at all
    assert [(v.origin, v.group) for v in node.views()] == [(node_id_of(ONE), "agent-1")]
    assert node.rejected[Reason.AGENT_NOT_BOUND] == 3
    assert view_refusal(node.manifest, node.cache[0].meta) is None


def test_a_manifest_that_binds_no_agent_backs_no_view(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    with caplog.at_level("WARNING"):
        node = _node(_manifest(1, {1: None, 2: None}))
    assert "the fleet manifest binds no member to a cordial agent: every peer view is " \
        "refused (agent_not_bound)" in caplog.text
    assert _offer(node, 2, "agent-1", 1) is Reason.AGENT_NOT_BOUND
    assert node.views() == []


def test_a_newer_manifest_that_moves_a_binding_drops_the_views_it_no_longer_backs() -> None:
    node = _node(_manifest(1, {1: 0, 2: 1, 3: None}))
    assert _offer(node, 2, "agent-1", 1) is None
    moved = _manifest(2, {1: 0, 2: None, 3: 1})  # the admin rebinds agent 1 to key 3
    node.install_manifest(moved, moved.sign(ADMIN), NOW)
    assert node.views() == []
    assert node.rejected[Reason.AGENT_NOT_BOUND] == 1
    assert _offer(node, 3, "agent-1", 2) is None
    assert [v.origin for v in node.views()] == [node_id_of(MALLORY)]
