"""Fleet manifests: the admin-signed list of who may publish entries.

A manifest is a :class:`SignedEnvelope` under :data:`MANIFEST_DOMAIN`, signed by the fleet's
admin key, whose body lists the fleet id, a strictly increasing ``seq``, the members (node
id, public key, optional ``not_after``, optional cordial ``agent``) and the revoked node ids.

A member's ``agent`` binds it to one cordial agent index (issue 24): only its views are used as
that agent's, whatever cache group a sender signs. It is a fourth item of the member's array,
present only when set, so a manifest binding no agent is byte-for-byte the old format and an
old manifest (three items a member) still decodes. Nodes accept a manifest
only if it verifies against the admin key from their own configuration and its ``seq`` is
higher than the one they hold; it then spreads between nodes like an entry.

It encodes and decodes the manifest file's bytes but never opens a file: its callers
(``peerd.store.fleetdir``, ``peerd.store.persist``, the daemon) read and write them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.reasons import Reason
from peerd.protocol.envelope import MANIFEST_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import as_node_id, node_id_from_public_key
from peerd.protocol.limits import (
    FLEET_ID_LEN,
    MAX_AGENT_INDEX,
    MAX_BIN_LEN,
    MAX_MANIFEST_FRAME_LEN,
    MAX_MEMBERS,
    MAX_REVOKED,
    PUBLIC_KEY_LEN,
)
from peerd.protocol.wire import (
    Fields,
    as_bytes,
    as_float,
    as_int,
    as_list,
    malformed,
    pack,
    unpack_exact,
)

MANIFEST_TYPE = "manifest"
#: Largest manifest file read from disk: a Manifest frame's worth, like on the wire.
MAX_MANIFEST_FILE_LEN = MAX_MANIFEST_FRAME_LEN
_KEYS = frozenset({"type", "fleet", "seq", "members", "revoked"})


@dataclass(frozen=True, slots=True)
class Member:
    node_id: str
    public_key: bytes
    #: UNIX seconds after which the membership lapses; None = no expiry.
    not_after: float | None = None
    #: The cordial agent index this member is (its views alone speak for that agent); None:
    #: bound to no agent.
    agent: int | None = None

    def to_wire(self) -> list[Any]:
        # No fourth item when unbound: such a manifest keeps the pre-binding bytes.
        base: list[Any] = [self.node_id, self.public_key, self.not_after]
        return base if self.agent is None else [*base, self.agent]


@dataclass(frozen=True, slots=True)
class Manifest:
    fleet_id: bytes
    seq: int
    members: tuple[Member, ...] = ()
    revoked: frozenset[str] = field(default_factory=frozenset)
    #: node id -> member, built once: every session and every admitted entry looks a node
    #: up, and a fleet may have MAX_MEMBERS of them. Not part of equality (it follows
    #: ``members``).
    _by_id: dict[str, Member] = field(init=False, repr=False, compare=False,
                                      default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {m.node_id: m for m in self.members})

    def to_bytes(self) -> bytes:
        return pack(
            {
                "type": MANIFEST_TYPE,
                "fleet": self.fleet_id,
                "seq": self.seq,
                "members": [m.to_wire() for m in sorted(self.members, key=lambda m: m.node_id)],
                "revoked": sorted(self.revoked),
            }
        )

    @classmethod
    def from_bytes(cls, body: bytes) -> Manifest:
        f = Fields(unpack_exact(body, MAX_BIN_LEN), "manifest body", _KEYS)
        if f.raw("type") != MANIFEST_TYPE:
            malformed("manifest body has the wrong type tag")
        members: list[Member] = []
        for i, raw in enumerate(f.get("members", as_list, MAX_MEMBERS)):
            item = as_list(raw, f"members[{i}]", 4)
            if len(item) < 3:
                malformed(f"members[{i}] must have 3 or 4 items, got {len(item)}")
            node_id = as_node_id(item[0], f"members[{i}].node_id")
            key = as_bytes(item[1], f"members[{i}].public_key", PUBLIC_KEY_LEN)
            if node_id_from_public_key(key) != node_id:
                malformed(f"members[{i}]: node id does not match its public key")
            not_after = None if item[2] is None else as_float(item[2], f"members[{i}].not_after")
            agent = None
            if len(item) == 4:
                agent = as_int(item[3], f"members[{i}].agent", 0, MAX_AGENT_INDEX)
            members.append(Member(node_id, key, not_after, agent))
        revoked = [as_node_id(r, "revoked[]") for r in f.get("revoked", as_list, MAX_REVOKED)]
        ids = [m.node_id for m in members]
        if len(set(ids)) != len(ids) or len(set(revoked)) != len(revoked):
            malformed("duplicate node id in manifest")
        if set(ids) & set(revoked):
            malformed("a node id is both a member and revoked")
        return cls(
            fleet_id=f.get("fleet", as_bytes, FLEET_ID_LEN),
            seq=f.get("seq", as_int),
            members=tuple(sorted(members, key=lambda m: m.node_id)),
            revoked=frozenset(revoked),
        )

    # --- membership ------------------------------------------------------------------

    def member(self, node_id: str) -> Member | None:
        return self._by_id.get(node_id)

    def agent_of(self, node_id: str) -> int | None:
        """The cordial agent ``node_id`` is bound to; None if it is bound to none."""
        m = self._by_id.get(node_id)
        return None if m is None else m.agent

    @property
    def binds_agents(self) -> bool:
        """Whether any member is bound to a cordial agent."""
        return any(m.agent is not None for m in self.members)

    def check_member(self, node_id: str, now: float) -> Member:
        """The member record, or REVOKED / NOT_MEMBER / EXPIRED."""
        if node_id in self.revoked:
            raise ProtocolError(Reason.REVOKED, f"{node_id} is revoked")
        m = self.member(node_id)
        if m is None:
            raise ProtocolError(Reason.NOT_MEMBER, f"{node_id} is not a fleet member")
        if m.not_after is not None and not now <= m.not_after:
            raise ProtocolError(Reason.EXPIRED, f"{node_id}'s membership expired")
        return m

    def member_by_key(self, public_key: bytes, now: float) -> Member:
        if len(public_key) != PUBLIC_KEY_LEN:
            raise ProtocolError(Reason.MALFORMED, "public key has the wrong length")
        return self.check_member(node_id_from_public_key(public_key), now)

    # --- edits (admin side); each returns a new manifest with seq + 1 ----------------

    def admit(self, public_key: bytes, not_after: float | None,
              agent: int | None = None) -> Manifest:
        """Admit (or renew) a key; ``agent`` binds it to that cordial agent index. ValueError
        for a revoked key, a full manifest, or an agent another member is bound to (two
        origins speaking for one agent is what the binding exists to prevent)."""
        node_id = node_id_from_public_key(public_key)
        if node_id in self.revoked:
            raise ValueError(f"{node_id} is revoked; a revoked key is never re-admitted")
        if not_after is not None and not math.isfinite(not_after):
            raise ValueError("not_after must be finite")
        if agent is not None and not 0 <= agent <= MAX_AGENT_INDEX:
            raise ValueError(f"agent must be in [0, {MAX_AGENT_INDEX}], got {agent}")
        others = tuple(m for m in self.members if m.node_id != node_id)
        if len(others) + 1 > MAX_MEMBERS:
            raise ValueError(f"a manifest holds at most {MAX_MEMBERS} members")
        taken = [m.node_id for m in others if agent is not None and m.agent == agent]
        if taken:
            raise ValueError(f"agent {agent} is already bound to {taken[0]}")
        members = sorted((*others, Member(node_id, public_key, not_after, agent)),
                         key=lambda m: m.node_id)
        return replace(self, seq=self.seq + 1, members=tuple(members))

    def revoke(self, node_id: str) -> Manifest:
        if len(self.revoked) + 1 > MAX_REVOKED:
            raise ValueError(f"a manifest holds at most {MAX_REVOKED} revoked ids")
        return replace(
            self,
            seq=self.seq + 1,
            members=tuple(m for m in self.members if m.node_id != node_id),
            revoked=self.revoked | {node_id},
        )

    def sign(self, admin_key: Ed25519PrivateKey) -> SignedEnvelope:
        return SignedEnvelope.sign(admin_key, MANIFEST_DOMAIN, self.fleet_id, self.to_bytes())


def verify_manifest(envelope: SignedEnvelope, admin_key: bytes, fleet_id: bytes) -> Manifest:
    """Verify against the configured admin key *then* decode; WRONG_FLEET if mismatched."""
    body = envelope.verify(MANIFEST_DOMAIN, fleet_id, expected_key=admin_key)
    manifest = Manifest.from_bytes(body)
    if manifest.fleet_id != fleet_id:
        raise ProtocolError(Reason.WRONG_FLEET, "manifest body names another fleet")
    return manifest


def accept_manifest(
    held: Manifest | None, envelope: SignedEnvelope, admin_key: bytes, fleet_id: bytes
) -> Manifest:
    """The new manifest if it verifies and is newer than ``held``; else ProtocolError.

    An older or equal ``seq`` is NOT_NEWER (replay/rollback of an older membership list,
    e.g. to un-revoke a key); an equal ``seq`` with different contents means the admin key
    signed two manifests with one seq: EQUIVOCATION.
    """
    manifest = verify_manifest(envelope, admin_key, fleet_id)
    if held is not None:
        if manifest.seq == held.seq and manifest != held:
            raise ProtocolError(Reason.EQUIVOCATION, f"two different manifests with seq {held.seq}")
        if manifest.seq <= held.seq:
            raise ProtocolError(Reason.NOT_NEWER, f"manifest seq {manifest.seq} <= {held.seq}")
    return manifest


def encode_manifest_file(envelope: SignedEnvelope) -> bytes:
    """On-disk manifest: the msgpack envelope map, exactly as in a Manifest message."""
    return pack(envelope.to_wire())


def decode_manifest_file(data: bytes) -> SignedEnvelope:
    """Parse (not verify) a manifest file; verification needs the trusted admin key."""
    return SignedEnvelope.from_wire(unpack_exact(data, MAX_MANIFEST_FILE_LEN))
