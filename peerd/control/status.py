"""The daemon's status as typed values, and its one JSON codec (the schema lives here once).

``peerd status --json`` prints :func:`to_json` of a :class:`Status`; ``peerd status`` and the
demo read the same :class:`Status` back with :func:`from_json` (``peerd peers`` its rows with
:func:`peers_from_json`; the metrics endpoint is handed the value itself), which checks the
shape and raises :class:`StatusError` naming every key that is missing or of the wrong type.
The dataclasses below *are* the schema: a key's JSON name is the field's name and keys appear
in field order, so adding a field adds it to the JSON, to the decoder and to the documented
shape (``docs/operations.md``; a test holds the three together).

The JSON rules (tuples are lists, an optional number that is NaN or infinite is ``null``,
unknown keys ignored, numbers kept in their JSON form) are :mod:`peerd.control.jsoncodec`'s.

This module is pure and light (``peerd status`` imports it without torch or libp2p): it must
not import the daemon, the transport or the node state. :mod:`peerd.control.snapshot` builds a
:class:`Status` from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Re-exported: the status module is where callers have always found them.
from peerd.control.jsoncodec import Codec, what
from peerd.control.jsoncodec import StatusError as StatusError
from peerd.control.jsoncodec import finite as finite
from peerd.node.peers import PeerSource

Staleness = Literal["time", "rounds"]


# ---------------------------------------------------------------------------- the schema


@dataclass(frozen=True, slots=True)
class NodeStatus:
    id: str
    fleet: str  # hex
    round: int
    version: int  # of the own model (published or not)
    examples: int
    train_loss: float | None
    val_loss: float | None
    val_accuracy: float | None
    own_alpha: float | None
    published_version: int | None
    manifest_seq: int
    listen: tuple[str, ...]
    #: Since start, peers no longer listed included (the metrics' byte counters).
    bytes_in: int
    bytes_out: int
    #: "member"; or why this node is not one (not_member, revoked, expired: by its own
    #: manifest, or as a peer refused it); "unknown" while it holds no signed manifest.
    membership: str
    #: The own model's weight in the last blend after the robust rule (see CacheRow.weight).
    own_weight: float | None = None


MEMBER = "member"


def membership_advice(fleet: str, node_id: str, membership: str) -> str | None:
    """What the operator of a node that is not admitted must do (None for a member, or while
    nothing is known): the daemon logs it and ``peerd status`` shows it."""
    if membership in (MEMBER, "unknown"):
        return None
    what = {"revoked": "revoked from", "expired": "membership expired in"}.get(
        membership, "not admitted to")
    return f"{what} fleet {fleet}: ask the admin to run 'peerd fleet admit {node_id}'"


@dataclass(frozen=True, slots=True)
class ConfigStatus:
    """The learning settings a node runs with (built by ``Config.status_config`` only)."""

    tau_max: float
    staleness: Staleness
    capacity: int
    rho: float
    local_steps: int
    alpha: str
    epsilon: float
    #: Seconds after which an unchanged model is republished anyway (ε > 0 skips publishes).
    max_silence_s: float
    round_interval_s: float
    task: str
    #: What runs (``Config.status_config`` settles it; the status never makes a reader
    #: guess): the mode, by peerd.core.modes.ModeName's names ("weights", "knowledge",
    #: "cordial", "sensors"); plain strings, so a client older than a new mode still reads it.
    mode: str
    #: The blend rule in force (``[learning] blend``: "weighted", "median", "krum:1", ...);
    #: "none" in the modes that average no models.
    blend: str
    #: How the node trains after the blend: "plain", "fedbss", "distillation" (knowledge
    #: mode) or "two-time-scale" (the cordial modes).
    local_policy: str
    #: Who trains weight mode's local step (``[learner] kind``): "builtin", "python",
    #: "flower"; "builtin" in the other modes.
    learner: str = "builtin"
    #: How this node encodes the weight entries it signs (``[fleet] entry_encoding``:
    #: "float32", "float16", "bfloat16", "int8" or "int8:B").
    encoding: str = "float32"


@dataclass(frozen=True, slots=True)
class CacheRow:
    origin: str
    version: int
    created_at: float
    age_s: float
    staleness: float  # seconds or rounds, per ConfigStatus.staleness
    examples: int
    alpha: float | None
    drift: float | None
    received_from: str | None
    received_at: float
    verified: bool
    #: "weights", or "knowledge" (per-sample logits: ``examples`` counts its samples).
    kind: str = "weights"
    #: The cache group its origin signed into it (``[learning] group``); None: none.
    group: str | None = None
    #: Its weight in the last blend after update-norm validation and the blend rule
    #: (clipping and Krum change α; a rejected or unselected entry has 0). None: the plan α
    #: was used as it is, or the rule has no per-entry weights (median, trimmed mean).
    weight: float | None = None
    #: How its origin encoded it on the wire (see ConfigStatus.encoding; each origin chooses
    #: and signs its own). None for typed entries, whose tensors are never re-encoded.
    encoding: str | None = None


@dataclass(frozen=True, slots=True)
class PeerRow:
    id: str
    addrs: tuple[str, ...]
    connected: bool
    last_seen: float | None
    bytes_in: int
    bytes_out: int
    budget_refusals: int
    source: PeerSource
    sessions: int
    last_error: str | None
    #: Failed dials and refused sessions in a row (reset by a good session); while > 0 the
    #: peer is dialled only after an exponential backoff.
    failures: int
    #: Seconds until it may be dialled again (0: at the next sweep); None: no backoff.
    retry_in_s: float | None
    #: How it is reached now (peerd.node.paths): "lan", "direct", "relayed" or
    #: "hole-punched"; None while not connected. A plain string, so that an older client
    #: still reads a kind added later.
    path: str | None = None
    #: The relay's peer id on a relayed path (None otherwise, or when it is unknown).
    relay: str | None = None
    #: Round-trip time in ms over /ipfs/ping/1.0.0: smoothed (RFC 6298's SRTT, gain 1/8)
    #: and the last sample; None until a ping of this connection succeeded.
    rtt_ms: float | None = None
    rtt_last_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ViewRow:
    """One held view (cordial mode): a peer's per-sample vectors for ids of the shared index."""

    origin: str
    #: The agent its signed group names (``agent-<j>``); None: none, so it is not used.
    agent: int | None
    version: int
    age_s: float
    #: How many of the current ids (the shared index) it covers.
    ids: int
    #: It was the freshest view of its agent and fed the last round's Λ_j^i.
    used: bool


@dataclass(frozen=True, slots=True)
class ViewsStatus:
    """Cordial mode's views: this agent, the current ids and the peers' views held."""

    agent: int
    agents: int
    ids: int  # the shared index: every id this node publishes and reads views for
    coordination: bool  # false: the isolated baseline (views published, none used)
    epoch: float
    test_accuracy: float | None  # last round, with the views it used
    test_loss: float | None
    peers: tuple[ViewRow, ...]


@dataclass(frozen=True, slots=True)
class ExternalStatus:
    """``[learner] kind = "external"``: the socket a training process attaches to and what
    came over it since start (refused publishes are counted in ``LearnerStatus.failed``)."""

    socket: str
    #: Training processes attached now.
    clients: int
    blends: int
    #: Publishes accepted by the checks, and when the last one came (Unix time).
    publishes: int
    last_publish: float | None
    #: The version the last accepted publish was signed as (None: none, or not published:
    #: it moved no more than ``[learning] epsilon``).
    last_version: int | None


@dataclass(frozen=True, slots=True)
class LearnerStatus:
    """A learner of the user's (``[learner] kind`` python, flower or external) and its
    worker (or, external, its socket)."""

    kind: str
    entry: str | None
    device: str  # resolved: "cpu", "cuda:0", ...
    #: The last successful fit's metrics: at most 32 names over the daemon's life (later new
    #: names are dropped and counted in ``metrics_dropped``).
    metrics: Mapping[str, float]
    metrics_dropped: int
    #: Rounds refused since start, by reason (every reason of the closed set, 0 included).
    failed: Mapping[str, int]
    last_failure: str | None
    last_detail: str | None
    last_failed_round: int | None
    #: The worker's pid while one runs, and how many times it was started again.
    worker_pid: int | None
    worker_restarts: int
    #: kind = external only: its socket and clients.
    external: ExternalStatus | None = None


@dataclass(frozen=True, slots=True)
class TrackingStatus:
    """``[tracking]``'s sinks (peerd.control.tracking): what they wrote and what failed."""

    sinks: tuple[str, ...]  # "mlflow", "tensorboard"
    #: Rounds every sink wrote, and each sink's failed rounds (every configured sink listed).
    written: int
    failed: Mapping[str, int]
    #: Rounds dropped because the sinks fell 64 rounds behind; learner metric values left out
    #: past the first 32 names of each kind.
    dropped_rounds: int
    names_dropped: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class RelayRow:
    """One relay the relay client keeps a reservation on (peerd.net.relayclient)."""

    addr: str  #: ``…/tcp/PORT/p2p/<relay id>``
    #: "configured" (``[network] relays``) or "learned" (address exchange).
    source: Literal["configured", "learned"]
    reserved_until: float | None  #: Unix time the held reservation ends; None: none held
    failures: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class ReachabilityStatus:
    """Whether this node is dialable from outside (peerd.net.reachability: AutoNAT dial-backs
    asked of the relays, configured and learned), and those relays."""

    #: "public" (no relay reservation is made), "private" or "unknown" (reservations held).
    verdict: str
    servers: int  #: relays asked
    reached: int  #: of them, those whose latest answer is that they reached us
    not_reached: int  #: those whose latest answer is that they did not
    #: Seconds since the last check (None before the first).
    checked_s_ago: float | None
    last_error: str | None
    #: The relay client's relays: the configured ones in order, then the learned.
    relays: tuple[RelayRow, ...] = ()


@dataclass(frozen=True, slots=True)
class Status:
    """What ``peerd status --json`` prints: one snapshot, never changed once built."""

    node: NodeStatus
    config: ConfigStatus
    cache: tuple[CacheRow, ...]
    peers: tuple[PeerRow, ...]
    accepted: int  # entries admitted into the cache since start
    rejected: Mapping[str, int]  # by reason, sorted: hostile or broken entries
    dropped: Mapping[str, int]  # by reason, sorted: benign (stale, not newer, evicted)
    flagged: tuple[str, ...]  # origins caught equivocating
    #: Entry bytes (head + payload) by "sent/KIND" and "received/KIND" since start.
    entry_bytes: Mapping[str, int] = field(default_factory=dict)
    #: Gossip's own bounds at work since start: "busy_refusals" (inbound sessions refused
    #: while max_inbound_sessions ran), "duplicates_avoided" (entries left out of a Want
    #: because another session was fetching them), "sweeps", "dials" (sessions this node
    #: started), "most_dials_in_a_sweep" (at most ``[network] fanout``) and
    #: "most_outbound_at_once" (its own sessions running together, older sweeps' included).
    gossip: Mapping[str, int] = field(default_factory=dict)
    #: py-libp2p's per-peer state as bounded by peerd (mend 15): "peerstore" (peers it
    #: holds, at most 2,048), "per_peer_entries" (in all its per-peer tables), "connections",
    #: "identified", and since start "forgotten" (outsiders dropped once disconnected),
    #: "evicted" (peerstore entries evicted by the bound) and "handler_errors" (library
    #: stream handlers that raised: fenced, the stream reset); with ``[network] hole_punch``
    #: also DCUtR's (mend 16): "dcutr_refused" (streams of non-members reset unread),
    #: "dcutr_busy" (streams reset as one too many at once), "dcutr_punches" (direct
    #: connections it opened), "dcutr_punched" (peers punched now), "dcutr_tracked" (peers
    #: in its largest per-peer table). Empty before the host is up.
    libp2p: Mapping[str, int] = field(default_factory=dict)
    #: Cordial mode (``[learning] mode = "cordial"``): whose views are held, for how many of
    #: the current ids; None in the other modes.
    views: ViewsStatus | None = None
    #: Weight mode with a learner of the user's (``[learner] kind`` python, flower,
    #: external): its worker (or socket), failures and last metrics; None with the builtin
    #: learner and in other modes.
    learner: LearnerStatus | None = None
    #: ``[tracking]`` set (MLflow, TensorBoard): its sinks' counts; None without one.
    tracking: TrackingStatus | None = None
    #: The relay client runs (``[network] relays`` set, or ``learn_relays``): the
    #: reachability verdict and the relays; None without a relay client.
    reachability: ReachabilityStatus | None = None


@dataclass(frozen=True, slots=True)
class OfflineNode:
    id: str | None  # None: no readable node.key
    round: int
    version: int
    counters_lost: bool


@dataclass(frozen=True, slots=True)
class OfflineCacheRow:
    origin: str
    version: int | None
    received_from: str | None
    received_at: float | None
    blob: str
    bytes: int


@dataclass(frozen=True, slots=True)
class OfflineStatus:
    """``peerd status --state-dir DIR --json`` while the daemon is down: what the disk holds."""

    running: Literal[False]
    state_dir: str
    node: OfflineNode
    cache: tuple[OfflineCacheRow, ...]


@dataclass(frozen=True, slots=True)
class Flags:
    """The control API's ``flags`` and ``clear_flag`` result, and ``peerd flags --json``:
    the origins flagged for equivocation (after the clear), the one a ``clear_flag`` cleared,
    and whether a running daemon answered (False: read from its state directory)."""

    running: bool
    flagged: tuple[str, ...]
    cleared: str | None


# ---------------------------------------------------------------------------- the codec

_STATUS, _OFFLINE, _PEER, _FLAGS = Codec(Status), Codec(OfflineStatus), Codec(PeerRow), Codec(Flags)


def to_json(status: Status | OfflineStatus) -> dict[str, Any]:
    """The JSON object of a status (plain dicts, lists and scalars, in schema order)."""
    return _STATUS.to_json(status) if isinstance(status, Status) else _OFFLINE.to_json(status)


def from_json(obj: Any) -> Status:
    """A :class:`Status` from parsed JSON; :class:`StatusError` lists every shape problem."""
    return _STATUS.from_json(obj)


def peers_to_json(peers: tuple[PeerRow, ...]) -> dict[str, Any]:
    """The control API's ``peers`` result: ``{"peers": [...]}``."""
    return {"peers": [_PEER.to_json(p) for p in peers]}


def peers_from_json(obj: Any) -> tuple[PeerRow, ...]:
    """The rows of a ``peers`` result; :class:`StatusError` on a wrong shape."""
    if not isinstance(obj, dict):
        raise StatusError([f"peers: expected an object holding a list, got {what(obj)}"])
    return _PEER.many_from_json(obj.get("peers"), "peers")


def flags_to_json(flags: Flags) -> dict[str, Any]:
    """The JSON object of a :class:`Flags` (``{"running", "flagged", "cleared"}``)."""
    return _FLAGS.to_json(flags)


def flags_from_json(obj: Any) -> Flags:
    """A :class:`Flags` from parsed JSON; :class:`StatusError` on a wrong shape."""
    return _FLAGS.from_json(obj)
