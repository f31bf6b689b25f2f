"""peerd's client library for a training process of the user's: an external learner.

With ``[learner] kind = "external"`` the daemon trains nothing itself; a process the user
starts attaches to it and loops ``blend()`` → train → ``publish()``
(:class:`~peerd.client.learner.ExternalLearner`, made by :func:`connect`). The daemon keeps
the cache, the blend, the checks, the signature and the gossip; the process keeps its own
loop, optimizer, data and device. docs/learners.md, "An external learner".
"""

from peerd.client.errors import BusyError as BusyError
from peerd.client.errors import ClientError as ClientError
from peerd.client.errors import DaemonGoneError as DaemonGoneError
from peerd.client.errors import NotRunningError as NotRunningError
from peerd.client.errors import PermissionDeniedError as PermissionDeniedError
from peerd.client.errors import PublishRefusedError as PublishRefusedError
from peerd.client.errors import WrongKindError as WrongKindError
from peerd.client.learner import ExternalLearner as ExternalLearner
from peerd.client.learner import Published as Published
from peerd.client.learner import connect as connect
