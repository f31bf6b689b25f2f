"""What :mod:`peerd.client` raises: one class per thing a training loop may want to handle,
each with a machine-readable ``code`` and a message that says what to do."""

from __future__ import annotations


class ClientError(Exception):
    """Talking to the daemon's learner socket failed; ``code`` says how."""

    code = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class NotRunningError(ClientError):
    """No daemon listens on the learner socket (not started, stopped, or crashed)."""

    code = "not_running"


class WrongKindError(ClientError):
    """A daemon runs on that state directory, but not with ``[learner] kind = "external"``."""

    code = "wrong_kind"


class PermissionDeniedError(ClientError):
    """The socket is another user's (0600), or a group's this process is not in (0660)."""

    code = "permission_denied"


class BusyError(ClientError):
    """The daemon serves as many clients as it may, or a publish waits for its round."""

    code = "busy"


class DaemonGoneError(ClientError):
    """The daemon closed the connection mid-call (it stopped); connect again once it runs."""

    code = "daemon_gone"


class PublishRefusedError(ClientError):
    """The daemon refused a publish: ``reason`` is one of the learner refusals (``schema``,
    ``non_finite``, ``examples``, ``malformed``: peerd.learn.learner.contract.Refusal), also
    counted in the daemon's ``learner_failed{reason}``; nothing was published."""

    code = "refused"

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"publish refused ({reason}): {detail}")
        self.reason = reason
        self.detail = detail
