"""Whether this node can be dialled from outside: AutoNAT v1 dial-back requests to the relays
it is configured with (issue 27 item 3). The servers are peerd.net.autonat's (``peerd relay``
and members with ``relay_service``); any libp2p AutoNAT v1 server answers the same protocol.

**The rule** (:func:`verdict`): each server's latest answer counts, an OK as a success and
an E_DIAL_ERROR as a failure; a refusal, an error or no answer counts as nothing. The spec
wants more than three servers agreeing; a member is given one or two relays, so the number
needed is ``min(CONFIRMATIONS, servers configured)``: with one relay its answer decides,
with two both must agree. ``public`` also needs no failure among the answers held, since the
two mistakes do not cost the same: a node wrongly judged private holds a reservation it did
not need; one wrongly judged public drops it and cannot be dialled from behind other NATs.
Anything else is ``unknown``. Answers older than ``ANSWER_TTL_S`` are dropped, and all of
them when the node's listen addresses change.

A verdict is about the servers asked: a relay on the same private network as the node
reaches it and says ``public``. Configure relays that sit where the other sites are.

**When**: at start, then every ``interval_s`` (bounded: ``INTERVAL_BOUNDS_S``), sooner
(``RETRY_S``) while the verdict is ``unknown``, and at once when the listen addresses change
(looked at every ``WATCH_S``) or the servers change. The answers table holds the servers
named now only: the configured relays and those learned by address exchange
(:meth:`Reachability.set_servers`, ``peerd.node.relaylearn``); a server named by DNS is
resolved when it is asked (``peerd.net.bootstrap.resolve_addr``, bounded).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID

from peerd.net.ask import ask
from peerd.net.autonat import AUTONAT_PROTOCOL
from peerd.net.bootstrap import resolve_addr
from peerd.net.relayclient import split_relay
from peerd.net.transport import Transport, TransportError
from peerd.protocol.peerrecord import is_circuit

logger = logging.getLogger(__name__)

#: Agreeing servers the spec asks for ("more than three"), when that many are configured.
CONFIRMATIONS = 4
#: Seconds one answer stays good: a node that moved behind a NAT must not keep an old OK.
ANSWER_TTL_S = 1800.0
#: Seconds between checks unless told otherwise, and the bounds of what may be told.
INTERVAL_S = 300.0
INTERVAL_BOUNDS_S = (30.0, 3600.0)
#: Seconds to the next check while the verdict is unknown (no server answered yet).
RETRY_S = 30.0
#: How often the listen addresses are compared with those last checked.
WATCH_S = 5.0
#: Deadline of one request (connect if need be, DIAL, the server's dial-backs, answer):
#: peerd's server answers within 30 s (4 ports, 5 s each, 5 s more for a failure).
REQUEST_TIMEOUT_S = 40.0
#: Largest answer read (a DIAL_RESPONSE is tens of bytes).
MAX_ANSWER_BYTES = 4096
#: Addresses advertised in one request (the server dials at most a few).
MAX_ADVERTISED = 8


class Verdict(enum.StrEnum):
    PUBLIC = "public"
    PRIVATE = "private"
    UNKNOWN = "unknown"


def verdict(answers: Sequence[bool], servers: int) -> Verdict:
    """The verdict from the servers' latest answers (True: reached us) of ``servers``
    configured: the module docstring's rule."""
    need = max(1, min(CONFIRMATIONS, servers))
    ok = sum(1 for a in answers if a)
    failed = len(answers) - ok
    if ok >= need and failed == 0:
        return Verdict.PUBLIC
    if failed >= need:
        return Verdict.PRIVATE
    return Verdict.UNKNOWN


@dataclass(frozen=True, slots=True)
class Answer:
    reached: bool
    at: float  #: clock time it came
    addr: str | None  #: where the server reached us (OK only)


@dataclass(frozen=True, slots=True)
class ReachabilitySnapshot:
    verdict: Verdict
    servers: int
    reached: int  #: servers whose latest answer is OK
    not_reached: int  #: servers whose latest answer is E_DIAL_ERROR
    checked_s_ago: float | None  #: since the last check (None before the first)
    last_error: str | None  #: why the last server that gave no verdict gave none


class ReachabilityError(Exception):
    """A server that could not be asked, refused, or answered nothing usable."""


class Reachability:
    """Asks ``servers`` (``/ip4|ip6/HOST/tcp/PORT/p2p/ID``) to dial back; :attr:`verdict`."""

    def __init__(self, transport: Transport, servers: Sequence[str], *,
                 interval_s: float = INTERVAL_S,
                 on_change: Callable[[Verdict], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        low, high = INTERVAL_BOUNDS_S
        if not low <= interval_s <= high:
            raise ValueError(f"reachability interval must be within {low:g}-{high:g} s")
        self._transport = transport
        self._servers = list(dict.fromkeys(servers))
        self._interval = interval_s
        self._on_change = on_change
        self._clock = clock
        self._answers: dict[str, Answer] = {}  # keyed by the configured server address
        self.verdict = Verdict.UNKNOWN
        self._checked_at: float | None = None
        self._last_error: str | None = None
        self.checked = trio.Event()  #: set after the first check
        self._servers_changed = False

    def set_servers(self, servers: Sequence[str]) -> None:
        """Ask these servers from now on (the configured and learned relays); the answers of
        those dropped go, and a check runs within WATCH_S."""
        new = list(dict.fromkeys(servers))
        if new == self._servers:
            return
        self._servers = new
        for key in [k for k in self._answers if k not in new]:
            del self._answers[key]
        self._servers_changed = True

    def needs_relay(self) -> bool:
        """The RelayClient's predicate: anything but a public verdict keeps reservations."""
        return self.verdict is not Verdict.PUBLIC

    def snapshot(self) -> ReachabilitySnapshot:
        held = self._current()
        return ReachabilitySnapshot(self.verdict, len(self._servers),
                                    sum(1 for a in held if a.reached),
                                    sum(1 for a in held if not a.reached),
                                    None if self._checked_at is None
                                    else max(0.0, self._clock() - self._checked_at),
                                    self._last_error)

    def _current(self) -> list[Answer]:
        now = self._clock()
        for key in [k for k, a in self._answers.items() if a.at <= now - ANSWER_TTL_S]:
            del self._answers[key]
        return list(self._answers.values())

    def _advertised(self) -> list[str]:
        return [a for a in self._transport.listen_addrs if not is_circuit(a)][:MAX_ADVERTISED]

    # ------------------------------------------------------------------ running
    async def run(self) -> None:
        while True:
            addrs = self._advertised()
            await self.check()
            wait = RETRY_S if self.verdict is Verdict.UNKNOWN else self._interval
            deadline = self._clock() + wait
            while self._clock() < deadline:
                await trio.sleep(min(WATCH_S, max(0.0, deadline - self._clock())))
                if self._advertised() != addrs:
                    logger.info("reachability: listen addresses changed, checking again")
                    self._answers.clear()
                    break
                if self._servers_changed:
                    break

    async def check(self) -> Verdict:
        """Ask every server once (together), then decide."""
        self._servers_changed = False
        async with trio.open_nursery() as nursery:
            for server in list(self._servers):
                nursery.start_soon(self._ask_one, server)
        self._checked_at = self._clock()
        new = verdict([a.reached for a in self._current()], len(self._servers))
        if new is not self.verdict:
            s = self.snapshot()
            logger.info("reachability: %s (was %s; %d of %d servers reached us, %d did not)",
                        new, self.verdict, s.reached, s.servers, s.not_reached)
            self.verdict = new
            if self._on_change is not None:
                self._on_change(new)
        self.checked.set()
        return self.verdict

    async def _ask_one(self, server: str) -> None:
        try:
            reached, addr = await self.ask(server)
        except ReachabilityError as exc:
            self._last_error = f"{server}: {exc}"
            logger.debug("reachability: %s", self._last_error)
            return
        if server in self._servers:  # not dropped while it was asked
            self._answers[server] = Answer(reached, self._clock(), addr)

    async def ask(self, server: str) -> tuple[bool, str | None]:
        """One DIAL to ``server``: (reached, the address it reached us at). Raises
        ReachabilityError when the answer is no verdict (refused, bad, none)."""
        head, server_id = split_relay(server)
        t = self._transport
        request = Message(type=Message.DIAL)
        request.dial.peer.id = t.host.get_id().to_bytes()
        for a in self._advertised():
            request.dial.peer.addrs.append(multiaddr.Multiaddr(a).to_bytes())
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                if not t.is_connected(server_id):
                    await t.connect(server_id, list(await resolve_addr(head)),
                                    timeout_s=REQUEST_TIMEOUT_S)
                raw = await ask(t.host, ID.from_base58(server_id), AUTONAT_PROTOCOL,
                                request.SerializeToString(), MAX_ANSWER_BYTES)
            answer = Message()
            answer.ParseFromString(raw)
        except trio.TooSlowError:
            raise ReachabilityError("timed out") from None
        except (TransportError, OSError) as exc:
            raise ReachabilityError(f"unreachable: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - streams and protobuf raise many types
            raise ReachabilityError(f"request failed: {exc!r}") from None
        if answer.type != Message.DIAL_RESPONSE:
            raise ReachabilityError("not a DIAL_RESPONSE")
        status = answer.dialResponse.status
        if status == Message.OK:
            try:
                where = str(multiaddr.Multiaddr(answer.dialResponse.addr))
            except Exception:  # noqa: BLE001 - the server's bytes
                where = None
            return True, where
        if status == Message.E_DIAL_ERROR:
            return False, None
        raise ReachabilityError(f"no verdict ({Message.ResponseStatus.Name(status)}: "
                                f"{answer.dialResponse.statusText[:100]})")
