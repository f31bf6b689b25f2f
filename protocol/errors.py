"""The one exception type everything hostile turns into.

The daemon counts rejections by :class:`~peerd.core.reasons.Reason`, so every refusal
carries one; ``code`` is what goes into an ``Error`` message on the wire. The reasons
themselves are not defined here: they live in ``peerd.core.reasons``, shared with the core.
"""

from __future__ import annotations

from peerd.core.reasons import Reason


class ProtocolError(Exception):
    """Bytes from the network (or a file) that peerd refuses, with the reason why."""

    #: Wire code for an ``Error`` message; subclasses with finer meaning override it.
    code_override: str | None = None

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message

    @property
    def code(self) -> str:
        """Stable short code to put in an ``Error`` frame (the reason unless refined)."""
        return self.code_override or self.reason.value


class VersionTooOldError(ProtocolError):
    """The peer speaks a protocol version we no longer accept (it must upgrade). Counted as
    ``version_too_old``, its wire code, not as malformed: an upgrade is due, not an attack."""

    def __init__(self, version: int, minimum: int) -> None:
        super().__init__(
            Reason.VERSION_TOO_OLD,
            f"protocol version {version} is older than the minimum {minimum}")
        self.version = version


class UnknownVersionError(ProtocolError):
    """The peer speaks a protocol version newer than ours (we must upgrade); counted as
    ``version_unknown``, its wire code."""

    def __init__(self, version: int, newest: int) -> None:
        super().__init__(
            Reason.VERSION_UNKNOWN,
            f"protocol version {version} is newer than the newest known {newest}")
        self.version = version


#: A peer's refusal that is about *us*, not about bytes we sent: the peer's manifest does not
#: admit this node. Counted under the peer's reason (the operator must act on it), any other
#: refusal as malformed.
MEMBERSHIP_REFUSALS: frozenset[Reason] = frozenset(
    {Reason.NOT_MEMBER, Reason.REVOKED, Reason.EXPIRED})
#: A peer's refusal of our protocol version: counted under its own name too, since the
#: operator must act on it (upgrade one side), and "malformed" would hide that.
VERSION_REFUSALS: frozenset[Reason] = frozenset({Reason.VERSION_TOO_OLD, Reason.VERSION_UNKNOWN})


class PeerRefusedError(ProtocolError):
    """The peer ended the session with an ``Error`` message: it refused us."""

    def __init__(self, code: str, text: str) -> None:
        membership = next((r for r in MEMBERSHIP_REFUSALS if r.value == code), None)
        version = next((r for r in VERSION_REFUSALS if r.value == code), None)
        super().__init__(membership or version or Reason.MALFORMED,
                         f"peer refused: {code} {text}")
        #: The peer's reason when it refused our membership (not_member, revoked, …).
        self.membership = membership
