"""Named reasons an entry is refused or dropped, shared by every layer for the audit log.

Pure Python on purpose, importing nothing of peerd: ``peerd.protocol`` imports this module
and must not pull in torch. The string values are stable: they appear in ``peerd status
--json`` under ``rejected`` and in the audit log, so renaming one is a breaking change.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # --- validation (peerd.core.validate): the entry itself is unacceptable -------------
    SCHEMA_MISMATCH = "schema_mismatch"  # schema id differs from the local model's
    DTYPE_MISMATCH = "dtype_mismatch"  # a tensor's dtype differs from the local schema
    SHAPE_MISMATCH = "shape_mismatch"  # a tensor's shape (or the tensor set) differs
    NON_FINITE = "non_finite"  # NaN or +-Inf anywhere in the parameters
    NORM_TOO_LARGE = "norm_too_large"  # float64 L2 norm above the configured bound
    #: ‖entry − own x̄‖ above the fleet-adaptive bound (peerd.core.updatenorm), action reject
    UPDATE_NORM_TOO_LARGE = "update_norm_too_large"
    EXAMPLES_NONPOSITIVE = "examples_nonpositive"  # num_examples <= 0
    EXAMPLES_OVER_CAP = "examples_over_cap"  # num_examples above the configured cap
    FUTURE_TIMESTAMP = "future_timestamp"  # created_at beyond now + allowed clock skew
    # --- cache merge (peerd.core.cache): valid, but not kept --------------------------
    STALE = "stale"  # staleness above tau_max
    NOT_NEWER = "not_newer"  # not newer than what is held: dropped, counted, not an error
    EQUIVOCATION = "equivocation"  # same origin+version, different payload
    EVICTED = "evicted"  # pushed out by capacity C (fresher entries won)
    OWN_ORIGIN = "own_origin"  # a peer relayed our own entry back to us
    UNREFERENCED = "unreferenced"  # a keys entry no held knowledge entry names (kinds)
    #: a cordial view whose group names an agent the manifest does not bind its origin to
    #: (peerd.daemon.modes.cordial): the sender chose a label, the admin did not speak for it
    AGENT_NOT_BOUND = "agent_not_bound"
    #: a cordial view far larger than that agent's recent accepted views
    #: (peerd.core.viewbound): not fed to the learner
    VIEW_TOO_LARGE = "view_too_large"
    #: a cordial view whose use in a round raised the learner's loss by orders of magnitude
    #: (peerd.learn.viewguard): the round ran again without it
    VIEW_RAISES_LOSS = "view_raises_loss"
    # --- protocol / membership (peerd.protocol): the envelope is unacceptable ---------
    MALFORMED = "malformed"  # frame or message does not parse
    BAD_SIGNATURE = "bad_signature"  # Ed25519 signature does not verify
    PAYLOAD_MISMATCH = "payload_mismatch"  # payload length/hash differs from the signed body
    #: an encoded tensor's bytes break its codec's rules (peerd.protocol.encoding: an int8
    #: scale NaN, negative or huge, an int8 value of -128): signed, so its origin's fault
    BAD_ENCODING = "bad_encoding"
    NOT_MEMBER = "not_member"  # origin not in the fleet manifest
    REVOKED = "revoked"  # origin revoked in the manifest
    EXPIRED = "expired"  # origin's membership past not_after
    WRONG_FLEET = "wrong_fleet"  # signed for another fleet
    TOO_LARGE = "too_large"  # exceeds a size limit before allocation
    TOO_SLOW = "too_slow"  # an entry arrived below the minimum rate while holding a slot
    VERSION_TOO_HIGH = "version_too_high"  # further ahead than time allows (protocol/ledger.py)
    MANIFEST_WITHHELD = "manifest_withheld"  # a peer claimed a newer manifest, sent none
    #: The peer's protocol version is below the oldest we accept (it must upgrade), or above
    #: the newest we know (we must): the wire's Error codes, counted under the same names.
    VERSION_TOO_OLD = "version_too_old"
    VERSION_UNKNOWN = "version_unknown"
    #: A keys entry that names a cache group: keys carry none (held beside the knowledge
    #: entry that names them, never counted by a group's quota), so one that does was not
    #: signed by a peerd node (docs/protocol.md "Cache group").
    KEYS_GROUP = "keys_group"


#: Reasons that mean "the entry was fine but we keep something better"; they are counted
#: separately from rejections so an operator does not mistake normal gossip for an attack.
BENIGN: frozenset[Reason] = frozenset(
    {Reason.STALE, Reason.NOT_NEWER, Reason.EVICTED, Reason.OWN_ORIGIN, Reason.UNREFERENCED}
)
