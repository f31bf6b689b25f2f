"""Build the typed :class:`~peerd.control.status.Status` from a node's in-memory state.

The daemon hands over plain inputs: its node state, the last round's numbers, its peer table,
a snapshot of the transport's counters (:data:`NO_TRANSPORT` before the host is up), its
config section and the current time. The result is a frozen value, so the control server,
the metrics endpoint and the round loop can share it without copies.

Runs in the event-loop thread and must stay quick (reads memory only). It must not import the
daemon or the transport: what it needs from them is typed by the protocols below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from peerd.control.status import (
    CacheRow,
    ConfigStatus,
    LearnerStatus,
    NodeStatus,
    PeerRow,
    ReachabilityStatus,
    Status,
    TrackingStatus,
    ViewsStatus,
    finite,
)
from peerd.node.peers import PeerTable

if TYPE_CHECKING:  # the node state imports torch; the protocols below only need its type
    from peerd.node.state import NodeState


class RoundNumbers(Protocol):
    """The daemon's last-round numbers (``peerd.daemon.host.Metrics``)."""

    @property
    def round(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def examples(self) -> int: ...
    @property
    def train_loss(self) -> float: ...
    @property
    def val_loss(self) -> float: ...
    @property
    def val_accuracy(self) -> float | None: ...
    @property
    def alpha(self) -> Mapping[str, float]: ...
    @property
    def drift(self) -> Mapping[str, float]: ...
    @property
    def weights(self) -> Mapping[str, float] | None: ...


class LinkCounters(Protocol):
    """One peer's transport counters (``peerd.net.transport.PeerStats``)."""

    @property
    def bytes_in(self) -> int: ...
    @property
    def bytes_out(self) -> int: ...
    @property
    def budget_refusals(self) -> int: ...
    @property
    def last_seen(self) -> float: ...


class PeerLink(Protocol):
    """How one connected peer is reached (built by the daemon from
    ``peerd.node.paths.classify`` and ``peerd.node.rtt.RttTable``)."""

    @property
    def path(self) -> str: ...
    @property
    def relay(self) -> str | None: ...
    @property
    def rtt_ms(self) -> float | None: ...
    @property
    def rtt_last_ms(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class TransportSnapshot:
    """What the transport reports: connected peers, per-peer counters, lifetime totals."""

    connected: frozenset[str] = frozenset()
    peers: Mapping[str, LinkCounters] = field(default_factory=dict)
    bytes_in: int = 0  # since start, peers no longer listed included
    bytes_out: int = 0
    #: Connected peers' paths and round-trip times (a connected peer may be missing: its
    #: path is not known yet).
    links: Mapping[str, PeerLink] = field(default_factory=dict)


#: Before the libp2p host is up: no connections, nothing moved.
NO_TRANSPORT = TransportSnapshot()


def _weight(weights: Mapping[str, float] | None, origin: str) -> float | None:
    return None if weights is None else finite(weights.get(origin))


def _encoding(kind: str, payload: object) -> str | None:
    """A held weight entry's wire encoding (``Held.encoding``, read by name: this module must
    not import the node state, which imports torch)."""
    encoding = getattr(payload, "encoding", None)
    return None if kind != "weights" or encoding is None else str(encoding)


def build_status(*, node: NodeState, numbers: RoundNumbers, peers: PeerTable,
                 transport: TransportSnapshot, config: ConfigStatus, listen: Sequence[str],
                 now: float, membership: str = "member",
                 gossip: Mapping[str, int] | None = None,
                 libp2p: Mapping[str, int] | None = None,
                 views: ViewsStatus | None = None,
                 learner: LearnerStatus | None = None,
                 tracking: TrackingStatus | None = None,
                 reachability: ReachabilityStatus | None = None) -> Status:
    clock = node.clock(now)
    cache = tuple(
        CacheRow(
            origin=item.meta.origin,
            version=item.meta.version,
            created_at=item.meta.created_at,
            age_s=now - item.meta.created_at,
            staleness=clock.staleness(item.meta),
            examples=item.meta.num_examples,
            alpha=finite(numbers.alpha.get(item.meta.origin)),
            drift=finite(numbers.drift.get(item.meta.origin)),
            received_from=item.received_from,
            received_at=item.received_at,
            verified=item.verified,
            kind=item.meta.kind,
            group=item.meta.group,
            weight=_weight(numbers.weights, item.meta.origin),
            encoding=_encoding(item.meta.kind, item.payload),
        )
        for item in node.cache
    )
    rows = []
    # Peers we connected to without knowing them (they dialled us between two sweeps) too.
    for pid in sorted(peers.ids() | transport.connected):
        p = peers.get(pid)
        s = transport.peers.get(pid)
        link = transport.links.get(pid) if pid in transport.connected else None
        rows.append(PeerRow(
            id=pid,
            addrs=p.addrs if p else (),
            connected=pid in transport.connected,
            last_seen=p.last_seen if p else (s.last_seen if s else None),
            bytes_in=s.bytes_in if s else 0,
            bytes_out=s.bytes_out if s else 0,
            budget_refusals=s.budget_refusals if s else 0,
            source=p.source if p else "inbound",
            sessions=p.sessions if p else 0,
            last_error=p.last_error if p else None,
            failures=p.failures if p else 0,
            retry_in_s=None if p is None or p.retry_at is None else max(0.0, p.retry_at - now),
            path=link.path if link else None,
            relay=link.relay if link else None,
            rtt_ms=finite(link.rtt_ms) if link else None,
            rtt_last_ms=finite(link.rtt_last_ms) if link else None,
        ))
    own = node.own
    return Status(
        node=NodeStatus(
            id=node.id,
            fleet=node.fleet_id.hex(),
            round=numbers.round,
            version=numbers.version,
            examples=numbers.examples,
            train_loss=finite(numbers.train_loss),
            val_loss=finite(numbers.val_loss),
            val_accuracy=finite(numbers.val_accuracy),
            own_alpha=finite(numbers.alpha.get(node.id)),
            own_weight=_weight(numbers.weights, node.id),
            published_version=own.entry.meta.version if own else None,
            manifest_seq=node.manifest.seq,
            listen=tuple(listen),
            bytes_in=transport.bytes_in,
            bytes_out=transport.bytes_out,
            membership=membership,
        ),
        config=config,
        cache=cache,
        peers=tuple(rows),
        accepted=node.accepted,
        rejected=dict(sorted(node.rejected.items())),
        entry_bytes=dict(sorted(node.entry_bytes.items())),
        dropped=dict(sorted(node.dropped.items())),
        flagged=tuple(sorted(node.ledger.flagged)),
        gossip=dict(gossip or {}),
        libp2p=dict(libp2p or {}),
        views=views,
        learner=learner,
        tracking=tracking,
        reachability=reachability,
    )
