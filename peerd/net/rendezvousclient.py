"""A member's side of libp2p's rendezvous protocol, at the rendezvous point a relay runs
(``peerd relay``, ``[network] relay_service``; the serving side is ``peerd.net.relay``): our
circuit addresses registered under the fleet's namespace, the other members' asked for.

The messages are built here (py-libp2p's message protobuf, its framing) rather than with
its ``RendezvousClient``, which registers the host's listen addresses (stripped of
everything after ``/p2p/``: a circuit would lose its relay) and reads answers of up to 4 MiB.

A relay need not run a rendezvous point (js-libp2p's has none): :func:`refused` tells a
relay that said so apart from one that failed to answer, so the relay client stops asking
it (each refused stream also costs an error line in py-libp2p's log) until it reconnects.

What a DISCOVER answer names is a hint like an mDNS record: bounded, members only
(``is_member`` is the caller's), and the Noise handshake proves the id when it is dialled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.discovery.rendezvous.config import RENDEZVOUS_PROTOCOL
from libp2p.discovery.rendezvous.pb.rendezvous_pb2 import Message
from libp2p.peer.id import ID
from libp2p.protocol_muxer.exceptions import MultiselectClientError

from peerd.net.ask import ask
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import as_node_id
from peerd.protocol.limits import MAX_RECORD_ADDRS
from peerd.protocol.peerrecord import check_record_addr

#: Deadline of one rendezvous request (REGISTER or DISCOVER and its answer).
RENDEZVOUS_TIMEOUT_S = 10.0
#: What we ask the rendezvous point to keep our registration for; we register again with
#: each reservation, long before it lapses.
REGISTRATION_TTL_S = 2 * 3600
#: Registrations taken from one DISCOVER answer. Threat: a rendezvous point is not a member
#: and is not trusted: an answer listing thousands of ids would make as many peer-table
#: entries and dials. A fleet larger than this meets the rest through address exchange.
MAX_RENDEZVOUS_PEERS = 64
#: Largest rendezvous answer read. Threat: bytes buffered from an untrusted relay before any
#: are looked at; MAX_RENDEZVOUS_PEERS registrations of MAX_RECORD_ADDRS short addresses fit.
MAX_RENDEZVOUS_MESSAGE_LEN = 64 << 10

#: py-libp2p 0.8.1's multistream-select message when the peer answered ``na`` to every
#: protocol offered (``_build_protocols_not_supported_message``); a timeout reads otherwise.
_NOT_SUPPORTED = "protocols not supported"

#: ``(node id, addresses)`` of a member found at a rendezvous point.
Found = tuple[str, tuple[str, ...]]


class RendezvousError(Exception):
    """A rendezvous request failed; ``unsupported``: the relay runs no rendezvous point."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the peer's ``na`` to the protocol, as opposed
    to a timeout or a broken connection, after which asking again may work."""
    seen: BaseException | None = exc
    for _ in range(8):  # a cause chain is short; bounded all the same
        if seen is None:
            return False
        if isinstance(seen, MultiselectClientError) and _NOT_SUPPORTED in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _ask(host: IHost, relay_id: str, request: Message) -> Message:
    try:
        with trio.fail_after(RENDEZVOUS_TIMEOUT_S):
            raw = await ask(host, ID.from_base58(relay_id), RENDEZVOUS_PROTOCOL,
                            request.SerializeToString(), MAX_RENDEZVOUS_MESSAGE_LEN)
        answer = Message()
        answer.ParseFromString(raw)
    except trio.TooSlowError:
        raise RendezvousError("rendezvous request timed out") from None
    except Exception as exc:  # noqa: BLE001 - streams and protobuf raise many types
        if refused(exc):
            raise RendezvousError("the relay runs no rendezvous point",
                                  unsupported=True) from None
        raise RendezvousError(f"rendezvous request failed: {exc!r}") from None
    return answer


async def register(host: IHost, relay_id: str, namespace: str,
                   circuits: Sequence[str]) -> tuple[bool, str]:
    """Register ``circuits`` under ``namespace`` at the relay: (accepted, the point's status
    text when it refused). RendezvousError when no answer came."""
    request = Message(type=Message.REGISTER)
    request.register.ns = namespace
    request.register.ttl = REGISTRATION_TTL_S
    request.register.peer.id = host.get_id().to_bytes()
    for addr in circuits:
        request.register.peer.addrs.append(multiaddr.Multiaddr(addr).to_bytes())
    answer = await _ask(host, relay_id, request)
    ok = (answer.type == Message.REGISTER_RESPONSE
          and answer.registerResponse.status == Message.ResponseStatus.OK)
    return ok, "" if ok else answer.registerResponse.statusText[:100]


async def discover(host: IHost, relay_id: str, namespace: str, own: str,
                   is_member: Callable[[str], bool]) -> list[Found]:
    """The members registered under ``namespace`` at the relay (at most
    MAX_RENDEZVOUS_PEERS; ourselves and non-members left out); [] for a refusal.
    RendezvousError when no answer came."""
    request = Message(type=Message.DISCOVER)
    request.discover.ns = namespace
    request.discover.limit = MAX_RENDEZVOUS_PEERS
    answer = await _ask(host, relay_id, request)
    if answer.type != Message.DISCOVER_RESPONSE or \
            answer.discoverResponse.status != Message.ResponseStatus.OK:
        return []
    found = []
    for reg in answer.discoverResponse.registrations[:MAX_RENDEZVOUS_PEERS]:
        taken = registration(reg, own, is_member)
        if taken is not None:
            found.append(taken)
    return found


def registration(reg: Message.Register, own: str,
                 is_member: Callable[[str], bool]) -> Found | None:
    """(node id, addresses) of one registration, or None: malformed, ours, or a node we
    would not admit. Addresses that a record could not hold are dropped, at most
    MAX_RECORD_ADDRS taken."""
    try:
        node_id = as_node_id(ID(reg.peer.id).to_base58(), "rendezvous peer id")
    except (ProtocolError, ValueError, TypeError):
        return None
    if node_id == own or not is_member(node_id):
        return None
    addrs: list[str] = []
    for raw in reg.peer.addrs[:MAX_RECORD_ADDRS]:
        try:
            addrs.append(check_record_addr(str(multiaddr.Multiaddr(raw))))
        except Exception:  # noqa: BLE001, S112 - multiaddr and our check: skip what fails
            continue
    return (node_id, tuple(dict.fromkeys(addrs))) if addrs else None
