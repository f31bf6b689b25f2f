"""Cache groups at the node: the own group is signed into published entries (memory and
state file), a received entry's group reaches the merge, the quota applies on accept, and
wants does not cut by recency while a quota is set (a Digest names no group)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from peerd.control.status import from_json, to_json
from peerd.node.state import NodeState, sign_own
from peerd.protocol.entry import EntryBody
from peerd.store import persist
from peerd.store.statedir import StateDir
from tests.control.test_snapshot import build
from tests.node.fleet import FLEET, NOW, key, manifest, model, node
from tests.node.test_node import deliver

KEYS = [key(n) for n in range(1, 8)]
MAN = manifest(*KEYS)


def grouped(k: int, group: str | None, **kw: object) -> NodeState:
    return dataclasses.replace(node(KEYS[k], MAN, **kw), group=group)  # type: ignore[arg-type]


def publish(n: NodeState, version: int, at: float) -> None:
    entry, message = sign_own(n.key, FLEET, params=model(version), version=version,
                              created_at=at, num_examples=50, group=n.group)
    n.set_own(entry, message)


def test_the_own_group_is_signed_into_the_entry_and_read_back_by_a_peer() -> None:
    a, b = grouped(0, "site-1"), grouped(1, None)
    publish(a, 1, NOW)
    assert a.own is not None
    assert a.own.entry.meta.group == "site-1"
    assert EntryBody.from_bytes(a.own.message.envelope.body).group == "site-1"
    assert deliver(a, b) == [None]
    assert [i.meta.group for i in b.cache] == ["site-1"]


def test_an_entry_published_into_the_state_file_carries_the_group(tmp_path: Path) -> None:
    a = grouped(0, "ward:east")
    held = persist.publish_own(StateDir(tmp_path / "state"), a, params=model(0), version=1,
                               created_at=NOW, num_examples=50)
    assert held.entry.meta.group == "ward:east"
    assert EntryBody.from_bytes(held.message.envelope.body).group == "ward:east"
    none = persist.publish_own(StateDir(tmp_path / "plain"), grouped(1, None), params=model(0),
                               version=1, created_at=NOW, num_examples=50)
    assert b"group" not in none.message.envelope.body


def test_the_quota_keeps_the_lone_group_that_recency_would_evict() -> None:
    # Relay r holds four fresh "crowd" entries and one older "lone" entry; a receiver with
    # C = 3 keeps the three freshest without a quota, one "lone" place with a quota of 2.
    relay = grouped(0, None, capacity=6)
    origins = [grouped(k, "crowd" if k < 5 else "lone") for k in range(1, 6)]
    for n, member in enumerate(origins):
        publish(member, 1, NOW - n)  # KEYS[5] ("lone") the oldest
        deliver(member, relay)
    plain, quota = grouped(6, None, capacity=3), grouped(6, None, capacity=3)
    quota.capacity_per_group = 2
    # Without a quota only the three freshest are even asked for; with one, every fresh
    # entry is (the Digest cannot say which group each is in).
    assert len(plain.wants(relay.digest(), NOW).items) == 3
    assert len(quota.wants(relay.digest(), NOW).items) == 5
    deliver(relay, plain)
    deliver(relay, quota)
    assert sorted(i.meta.group or "" for i in plain.cache) == ["crowd"] * 3
    assert sorted(i.meta.group or "" for i in quota.cache) == ["crowd", "crowd", "lone"]
    assert quota.dropped["evicted"] == 2
    # and expiry keeps the partition: nothing has aged, nothing changes
    before = list(quota.cache)
    quota.expire(NOW)
    assert quota.cache == before


def test_peerd_status_json_shows_each_entrys_group() -> None:
    a, b, c = grouped(0, "site-1"), grouped(1, None), grouped(2, None)
    publish(a, 1, NOW)
    publish(b, 1, NOW)
    deliver(a, c)
    deliver(b, c)
    status = build(c)
    rows = {row.origin: row.group for row in status.cache}
    assert rows == {a.id: "site-1", b.id: None}
    encoded = json.loads(json.dumps(to_json(status)))
    assert {row["origin"]: row["group"] for row in encoded["cache"]} == rows
    assert from_json(encoded) == status
