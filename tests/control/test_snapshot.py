"""The status builder: a node's state, the last round's numbers, the peer table and the
transport's counters in, one typed Status out (no daemon, no sockets)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from peerd.control.snapshot import NO_TRANSPORT, TransportSnapshot, build_status
from peerd.control.status import ConfigStatus, Status, from_json, to_json
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.reasons import Reason
from peerd.core.staleness import StalenessMode
from peerd.daemon.host import Metrics as Numbers  # the daemon's own last-round numbers
from peerd.node.peers import PeerTable
from peerd.node.state import NodeState, sign_own
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest, model, node

A, B = key(1), key(2)
CONFIG = ConfigStatus(tau_max=600.0, staleness="time", capacity=5, rho=0.01, local_steps=10,
                      alpha="uniform", epsilon=0.0, max_silence_s=300.0,
                      round_interval_s=10.0, task="digits", mode="weights",
                      blend="weighted", local_policy="plain")


@dataclass
class Link:
    bytes_in: int
    bytes_out: int
    budget_refusals: int
    last_seen: float


def peer_meta(origin: str, version: int = 4) -> EntryMeta:
    return EntryMeta(origin=origin, version=version, created_at=NOW - 30.0,
                     schema_id=SCHEMA.id, num_examples=120, digest="00" * 32)


def build(n: NodeState, *, numbers: Numbers | None = None, peers: PeerTable | None = None,
          transport: TransportSnapshot = NO_TRANSPORT, now: float = NOW) -> Status:
    return build_status(node=n, numbers=numbers or Numbers(), peers=peers or PeerTable(n.id),
                        transport=transport, config=CONFIG, listen=["/ip4/10.0.0.1/tcp/4011"],
                        now=now)


def test_a_node_before_its_first_round_and_before_the_transport_is_up() -> None:
    n = node(A, manifest(A, B))
    status = build(n)
    assert status.node.id == n.id
    assert status.node.fleet == FLEET.hex()
    assert status.node.train_loss is None  # NaN: not yet
    assert status.node.val_loss is None  # NaN: not yet
    assert status.node.own_alpha is None
    assert status.node.published_version is None
    assert status.node.bytes_in == status.node.bytes_out == 0
    assert status.node.listen == ("/ip4/10.0.0.1/tcp/4011",)
    assert status.cache == ()
    assert status.peers == ()
    assert status.config is CONFIG
    assert (status.accepted, status.rejected, status.dropped, status.flagged) == (0, {}, {}, ())
    assert from_json(json.loads(json.dumps(to_json(status)))) == status


def test_cache_rows_carry_age_staleness_and_the_last_blend() -> None:
    n = node(A, manifest(A, B))
    b_id = node(B, manifest(A, B)).id
    n.cache.append(CacheItem(peer_meta(b_id), b_id, NOW - 5.0))
    entry, message = sign_own(n.key, FLEET, params=model(), version=3, created_at=NOW,
                              num_examples=50)
    n.set_own(entry, message)
    numbers = Numbers(round=3, version=3, examples=50, train_loss=0.5, val_loss=math.inf,
                      val_accuracy=0.8, alpha={n.id: 0.6, b_id: 0.4}, drift={b_id: math.nan})
    status = build(n, numbers=numbers)
    (row,) = status.cache
    assert (row.origin, row.version, row.examples) == (b_id, 4, 120)
    assert row.age_s == row.staleness == 30.0
    assert row.alpha == 0.4
    assert row.drift is None  # NaN drift: not shown as a number
    assert (row.received_from, row.received_at, row.verified) == (b_id, NOW - 5.0, True)
    assert status.node.own_alpha == 0.6
    assert row.weight is None  # the plan α was blended as it is
    assert status.node.own_weight is None
    # Clipping changed them: the weights actually used are shown beside the plan α.
    clipped = build(n, numbers=dataclasses.replace(numbers, weights={n.id: 0.9, b_id: 0.1}))
    assert (clipped.cache[0].alpha, clipped.cache[0].weight) == (0.4, 0.1)
    assert clipped.node.own_weight == 0.9
    counted = build_status(node=n, numbers=numbers, peers=PeerTable(n.id),
                           transport=NO_TRANSPORT, config=CONFIG, listen=(), now=NOW,
                           gossip={"busy_refusals": 2, "duplicates_avoided": 5})
    assert counted.gossip == {"busy_refusals": 2, "duplicates_avoided": 5}
    assert to_json(counted)["gossip"] == {"busy_refusals": 2, "duplicates_avoided": 5}
    assert status.node.published_version == 3
    assert status.node.val_loss is None
    assert status.node.val_accuracy == 0.8
    # Counted by the round, not the wall clock, in rounds mode.
    n.mode, n.round = StalenessMode.ROUNDS, 6
    assert build(n, numbers=numbers).cache[0].staleness == 2.0


def test_refusals_are_sorted_and_flagged_origins_listed() -> None:
    n = node(A, manifest(A, B))
    for reason in (Reason.NOT_MEMBER, Reason.BAD_SIGNATURE, Reason.STALE, Reason.NOT_MEMBER):
        n.reject(reason)
    n.ledger.flagged.update({"12D3KooWz", "12D3KooWa"})
    status = build(n)
    assert list(status.rejected) == sorted(status.rejected)
    assert status.rejected[str(Reason.NOT_MEMBER)] == 2
    assert status.dropped == {str(Reason.STALE): 1}
    assert status.flagged == ("12D3KooWa", "12D3KooWz")


def test_peers_join_the_table_and_the_transport() -> None:
    n = node(A, manifest(A, B))
    table = PeerTable(n.id)
    table.on_hint("12D3KooWmdns", ["/ip4/10.0.0.2/tcp/4011"], NOW - 20.0)
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWstatic"], NOW - 10.0)
    known = table.get("12D3KooWstatic")
    assert known is not None
    table.failed(known, "refused", NOW - 1.0)
    assert known.retry_at is not None
    transport = TransportSnapshot(
        connected=frozenset({"12D3KooWmdns", "12D3KooWdialled"}),
        peers={"12D3KooWmdns": Link(100, 200, 1, NOW - 1.0),
               "12D3KooWdialled": Link(5, 6, 0, NOW - 2.0)},
        bytes_in=1_000, bytes_out=2_000)
    status = build(n, peers=table, transport=transport)
    rows = {p.id: p for p in status.peers}
    assert [p.id for p in status.peers] == sorted(rows)
    mdns, static, dialled = rows["12D3KooWmdns"], rows["12D3KooWstatic"], rows["12D3KooWdialled"]
    assert (mdns.connected, mdns.source, mdns.last_seen) == (True, "mdns", NOW - 20.0)
    assert (mdns.bytes_in, mdns.bytes_out, mdns.budget_refusals) == (100, 200, 1)
    assert (static.connected, static.addrs, static.last_error) == (
        False, ("/ip4/10.0.0.3/tcp/4011",), "refused")
    assert (static.bytes_in, static.bytes_out) == (0, 0)
    # The backoff of the failed peer: one failure, the next dial due in what is left of it.
    assert (static.failures, static.retry_in_s) == (1, known.retry_at - NOW)
    assert (mdns.failures, mdns.retry_in_s) == (0, None)
    # Connected but not (yet) in the table: it dialled us between two sweeps.
    assert (dialled.source, dialled.addrs, dialled.last_seen, dialled.sessions) == (
        "inbound", (), NOW - 2.0, 0)
    # Lifetime totals come from the transport, not the sum of the peers listed.
    assert (status.node.bytes_in, status.node.bytes_out) == (1_000, 2_000)


def test_a_backoff_that_ran_out_shows_zero_seconds() -> None:
    n = node(A, manifest(A, B))
    table = PeerTable(n.id)
    table.on_hint("12D3KooWpeer", ["/ip4/10.0.0.2/tcp/4011"], NOW - 600.0)
    peer = table.get("12D3KooWpeer")
    assert peer is not None
    table.failed(peer, "connection refused", NOW - 400.0)  # at most 5 s of backoff
    (row,) = build(n, peers=table).peers
    assert (row.failures, row.retry_in_s, row.last_error) == (1, 0.0, "connection refused")


@dataclass
class PathLink:
    path: str
    relay: str | None
    rtt_ms: float | None
    rtt_last_ms: float | None


def test_connected_peers_carry_their_path_and_rtt() -> None:
    n = node(A, manifest(A, B))
    table = PeerTable(n.id)
    table.on_hint("12D3KooWgone", ["/ip4/10.0.0.2/tcp/4011"], NOW - 20.0)
    transport = TransportSnapshot(
        connected=frozenset({"12D3KooWrelayed", "12D3KooWnew"}),
        links={"12D3KooWrelayed": PathLink("relayed", "12D3KooWrelay", 40.5, math.nan),
               # A path left over from a connection that is gone is not shown.
               "12D3KooWgone": PathLink("lan", None, 1.0, 1.0)})
    rows = {p.id: p for p in build(n, peers=table, transport=transport).peers}
    relayed, new, gone = rows["12D3KooWrelayed"], rows["12D3KooWnew"], rows["12D3KooWgone"]
    assert (relayed.path, relayed.relay, relayed.rtt_ms, relayed.rtt_last_ms) == (
        "relayed", "12D3KooWrelay", 40.5, None)  # NaN is shown as null
    # Connected, its path not read yet (the connection came up after the look).
    assert (new.path, new.relay, new.rtt_ms) == (None, None, None)
    assert (gone.connected, gone.path, gone.rtt_ms) == (False, None, None)
