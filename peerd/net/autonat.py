"""The AutoNAT v1 server (``/libp2p/autonat/1.0.0``): a peer asks "dial me back", we try, and
say whether we reached it (issue 27 item 3). Served beside the relay (``peerd relay`` and
``[network] relay_service``, peerd.net.relay); the asking side is peerd.net.reachability.

py-libp2p 0.8.1 ships ``libp2p.host.autonat.AutoNATService``; read from its source, it
cannot be used as the server:

- its dial-back is ``host.connect``, which returns at once when the host holds a connection
  to the peer — and the request itself came on one, so every answer is OK: every node looks
  public (tests/net/test_autonat.py shows it: OK for a port where nothing listens). The
  spec's dial-back is a *new* connection to the address;
- it dials only advertised addresses whose IP is the observed one, so a node behind a NAT
  (which advertises its private address) is never dialled at all: refused, not "private";
- nothing bounds its concurrent dial-backs, a peer's request rate, or the dial's duration.

This server dials with a separate dialer (:func:`dial_back`): a raw TCP connection, then
multistream-select and a Noise handshake under an identity of its own, which proves that the
asker's key answers at that address; the connection closes right after the handshake, before
any muxer, so the asker's swarm never adds it (no admission, no probation slot taken). It
dials only the observed IP, on the TCP ports the asker advertises (what go-libp2p does:
each address's IP is replaced by the observed one), which also covers a NAT with a port
forward; it refuses requests that came over a relayed connection (the IP there is the
relay's) and requests naming another peer id than the connection's. Bounds:
:class:`AutoNATLimits`.

It must not decide anything about the asker (members or not): the host's admission did.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.connection_types import ConnectionType
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.transport.tcp.tcp import TCP
from libp2p.transport.upgrader import TransportUpgrader
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

logger = logging.getLogger(__name__)

AUTONAT_PROTOCOL = TProtocol("/libp2p/autonat/1.0.0")


@dataclass(frozen=True, slots=True)
class AutoNATLimits:
    """What one AutoNAT server spends on others at most."""

    #: Dial-backs running at once; a request beyond is refused (E_DIAL_REFUSED), not queued.
    dials: int = 8
    #: Requests one peer id may make per ``window_s`` (a member asks every few minutes).
    per_peer: int = 4
    #: Requests from one IP per ``window_s``: a whole site behind one NAT shares its IP.
    per_ip: int = 64
    window_s: float = 60.0
    #: Peer ids and IPs whose recent requests are remembered; when full, a new one is refused.
    tracked: int = 4096
    #: Ports dialled per request (each on the observed IP).
    addrs: int = 4
    #: Deadline of one dial-back (TCP connect, multistream-select, Noise).
    dial_timeout_s: float = 5.0
    #: A failed dial-back is answered no sooner than this after the request (go-libp2p waits
    #: out its dial timeout too): the answer's timing must not tell a refused port from a
    #: filtered one, or the server is a port scanner of the asker's IP (a CGNAT's neighbours).
    failure_delay_s: float = 5.0
    #: Largest request read (a DIAL with a peer id and a few addresses is ~200 bytes; the
    #: library's own cap is 64 KiB).
    message_bytes: int = 4096

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) <= 0:
                raise ValueError(f"AutoNATLimits.{name} must be positive")


AUTONAT_LIMITS = AutoNATLimits()


class RateTable:
    """Requests per key in a sliding window, over a bounded number of keys."""

    def __init__(self, most: int, window_s: float, keys: int,
                 clock: Callable[[], float]) -> None:
        self._most, self._window, self._keys, self._clock = most, window_s, keys, clock
        self._seen: dict[str, deque[float]] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def take(self, key: str) -> bool:
        """Count one request of ``key``; False (and not counted) when it is over its rate or
        the table is full of keys still inside their window."""
        now = self._clock()
        times = self._seen.get(key)
        if times is None:
            if len(self._seen) >= self._keys:
                self._prune(now)
                if len(self._seen) >= self._keys:
                    return False
            times = self._seen[key] = deque()
        while times and times[0] <= now - self._window:
            times.popleft()
        if len(times) >= self._most:
            return False
        times.append(now)
        return True

    def _prune(self, now: float) -> None:
        for key in [k for k, t in self._seen.items() if not t or t[-1] <= now - self._window]:
            del self._seen[key]


def dialback_addrs(advertised: list[bytes], observed_ip: str, most: int) -> list[str]:
    """The addresses to dial: each advertised TCP port on ``observed_ip`` (nothing else is
    ever dialled: amplification), deduplicated, at most ``most``. Unparsable, non-TCP and
    relayed addresses are skipped."""
    family = "ip6" if ipaddress.ip_address(observed_ip).version == 6 else "ip4"
    out: list[str] = []
    for raw in advertised:
        try:
            parts = str(multiaddr.Multiaddr(raw)).split("/")
        except Exception:  # noqa: BLE001, S112 - an asker's bytes: skip what fails
            continue
        # /ip4/X/tcp/P[/p2p/ID] only: no DNS, no circuit, no other transport.
        if len(parts) < 5 or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp" \
                or (len(parts) > 5 and parts[5] != "p2p") or len(parts) > 7:
            continue
        try:
            port = int(parts[4])
        except ValueError:
            continue
        addr = f"/{family}/{observed_ip}/tcp/{port}"
        if 0 < port < 65536 and addr not in out:
            out.append(addr)
        if len(out) >= most:
            break
    return out


#: ``dial(peer_id, addr, timeout_s)`` → whether ``peer_id`` answered at ``addr``.
DialBack = Callable[[ID, str, float], Awaitable[bool]]


def noise_dialer() -> DialBack:
    """A dial-back on a fresh connection, under an identity that is not the server's
    (go-libp2p's server uses a separate dialer host for the same reason): TCP, then
    multistream-select + Noise; True when the handshake authenticated ``peer_id``."""
    key_pair = create_new_key_pair(os.urandom(32))
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    upgrader = TransportUpgrader({NOISE_PROTOCOL_ID: noise}, {})
    tcp = TCP(dns_max_retries=1)

    async def dial(peer_id: ID, addr: str, timeout_s: float) -> bool:
        raw = None
        try:
            with trio.fail_after(timeout_s):
                raw = await tcp.dial(multiaddr.Multiaddr(addr))
                secure = await upgrader.upgrade_security(raw, True, peer_id)
                await secure.close()
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to reach it is "not reached"
            logger.debug("autonat dial-back to %s at %s failed: %r", peer_id, addr, exc)
            return False
        finally:
            if raw is not None:
                with trio.move_on_after(1), contextlib.suppress(Exception):
                    await raw.close()  # already closed by the handshake's failure, maybe

    return dial


def _observed_ip(stream: INetStream) -> str | None:
    """The asker's IP on a direct connection; None on a relayed one or when unknown (then
    the request is refused: fail closed)."""
    try:
        conn = stream.muxed_conn
        if conn.get_connection_type() == ConnectionType.RELAYED:
            return None
        if any("/p2p-circuit" in str(a) for a in conn.get_transport_addresses()):
            return None
        remote = stream.get_remote_address()
    except Exception:  # noqa: BLE001 - a torn connection tells nothing
        return None
    if not remote:
        return None
    try:
        ip = ipaddress.ip_address(str(remote[0]))
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped if mapped is not None else ip)


def _answer(status: Message.ResponseStatus.ValueType, text: str = "",
            addr: str | None = None) -> Message:
    msg = Message(type=Message.DIAL_RESPONSE)
    msg.dialResponse.status = status
    if text:
        msg.dialResponse.statusText = text
    if addr is not None:
        msg.dialResponse.addr = multiaddr.Multiaddr(addr).to_bytes()
    return msg


@dataclass(slots=True)
class AutoNATStats:
    answered_ok: int = 0
    answered_error: int = 0  #: dialled and not reached
    refused: int = 0  #: relayed, rate, busy, no usable address, bad request


class AutoNATServer:
    """Serves ``/libp2p/autonat/1.0.0`` on ``host`` from :meth:`install` to :meth:`remove`."""

    def __init__(self, host: IHost, limits: AutoNATLimits = AUTONAT_LIMITS, *,
                 dial: DialBack | None = None,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.host = host
        self.limits = limits
        self.stats = AutoNATStats()
        self._dial = dial if dial is not None else noise_dialer()
        self._busy = 0
        self.peers = RateTable(limits.per_peer, limits.window_s, limits.tracked, clock)
        self.ips = RateTable(limits.per_ip, limits.window_s, limits.tracked, clock)

    def install(self) -> None:
        self.host.set_stream_handler(AUTONAT_PROTOCOL, self.handle)

    def remove(self) -> None:
        self.host.remove_stream_handler(AUTONAT_PROTOCOL)

    async def handle(self, stream: INetStream) -> None:
        try:
            with trio.fail_after(self.limits.dial_timeout_s * (self.limits.addrs + 1)
                                 + self.limits.failure_delay_s):
                raw = await read_varint_prefixed_bytes_limited(stream,
                                                               self.limits.message_bytes)
                answer = await self.answer(stream, raw)
                await stream.write(encode_varint_prefixed(answer.SerializeToString()))
        except Exception as exc:  # noqa: BLE001 - a peer's bytes must not end the host
            logger.debug("autonat stream failed: %r", exc)
        finally:
            with trio.move_on_after(1), contextlib.suppress(Exception):
                await stream.close()  # torn down already, maybe

    async def answer(self, stream: INetStream, raw: bytes) -> Message:
        """The DIAL_RESPONSE to one request read from ``stream``."""
        refused = self._check(stream, raw)
        if isinstance(refused, Message):
            self.stats.refused += 1
            return refused
        peer_id, addrs = refused
        self._busy += 1
        try:
            answer_at = trio.current_time() + self.limits.failure_delay_s
            for addr in addrs:
                if await self._dial(peer_id, addr, self.limits.dial_timeout_s):
                    self.stats.answered_ok += 1
                    return _answer(Message.OK, addr=addr)
            await trio.sleep_until(answer_at)  # holding the slot: the delay is bounded too
        finally:
            self._busy -= 1
        self.stats.answered_error += 1
        return _answer(Message.E_DIAL_ERROR, "dial-back failed")

    def _check(self, stream: INetStream, raw: bytes) -> Message | tuple[ID, list[str]]:
        request = Message()
        try:
            request.ParseFromString(raw)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
            return _answer(Message.E_BAD_REQUEST, "unparsable")
        if request.type != Message.DIAL or not request.HasField("dial"):
            return _answer(Message.E_BAD_REQUEST, "a DIAL is expected")
        remote = stream.muxed_conn.peer_id
        if bytes(request.dial.peer.id) != remote.to_bytes():
            return _answer(Message.E_BAD_REQUEST, "peer id is not the connection's")
        ip = _observed_ip(stream)
        if ip is None:
            return _answer(Message.E_DIAL_REFUSED, "no dial-back over a relayed connection")
        if not self.peers.take(str(remote)) or not self.ips.take(ip):
            return _answer(Message.E_DIAL_REFUSED, "too many requests")
        if self._busy >= self.limits.dials:
            return _answer(Message.E_DIAL_REFUSED, "busy")
        addrs = dialback_addrs(list(request.dial.peer.addrs), ip, self.limits.addrs)
        if not addrs:
            return _answer(Message.E_DIAL_REFUSED, "no TCP address to dial")
        return remote, addrs
