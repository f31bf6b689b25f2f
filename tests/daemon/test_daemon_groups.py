"""The daemon threads [learning] group and capacity_per_group into its node: the own entry it
publishes is signed in its group, and the node's merge applies the quota."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from peerd.daemon.daemon import Daemon
from peerd.protocol.entry import EntryBody
from peerd.store import persist
from tests.daemon.test_daemon_membership import _daemon


def _grouped(tmp_path: Path, group: str | None = None,
             capacity_per_group: int | None = None) -> Daemon:
    base = _daemon(tmp_path, admitted=True)
    learning = dataclasses.replace(base.cfg.learning, group=group,
                                   capacity_per_group=capacity_per_group)
    return Daemon(dataclasses.replace(base.cfg, learning=learning))


def test_the_configured_group_is_signed_into_the_published_entry(tmp_path: Path) -> None:
    d = _grouped(tmp_path, group="site-7", capacity_per_group=2)
    assert (d.node.group, d.node.capacity_per_group) == ("site-7", 2)
    held = persist.publish_own(d.state, d.node, params=d.model.state_dict(), version=1,
                               created_at=d.now(), num_examples=10)
    assert held.entry.meta.group == "site-7"
    assert EntryBody.from_bytes(held.message.envelope.body).group == "site-7"


def test_without_the_keys_the_node_is_as_before(tmp_path: Path) -> None:
    d = _grouped(tmp_path)
    assert (d.node.group, d.node.capacity_per_group) == (None, None)
    held = persist.publish_own(d.state, d.node, params=d.model.state_dict(), version=1,
                               created_at=d.now(), num_examples=10)
    assert b"group" not in held.message.envelope.body
