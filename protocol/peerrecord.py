"""Signed address records: where a member says it can be dialled, signed by its node key.

A member learns other members' addresses from the peers it meets (issue 27, item 1): each
side of a session hands on the records it holds of members, so one reachable bootstrap
address is enough to join a fleet spread over several sites. A record is worthless unless
its subject signed it, so a peer relaying records cannot forge where anyone lives; it can
only withhold them.

The shape follows libp2p's peer record (RFC 0003: peer id, seq, addresses in a signed
envelope), in this protocol's own envelope (msgpack, domain-separated, bound to the fleet:
``peerd.protocol.envelope``) rather than libp2p's protobuf one, plus an expiry, so a record
relayed for ever cannot keep a dead address alive::

    body = {"type": "addrs", "fleet": bin 16, "node": node id, "seq": int,
            "addrs": [multiaddr str, ...], "expires": float[, "relay": true]}
    sig  = Ed25519(node key, "peerd/addrs/v1\\0" || fleet || body)

``relay`` (present only as ``true``) says the subject runs a Circuit Relay v2 hop, a
rendezvous point and an AutoNAT server (``[network] relay_service``): members behind NATs
may reserve a slot there without being told to (``peerd.node.relaylearn``). It is signed
with the rest, so only the subject can claim it of itself, and it lives and expires with
the record. A record without it is byte for byte what releases before it sign; a release
before it refuses a body with the key (unknown keys are malformed), so such a record goes
only to peers announcing ``relayrec/v1`` (``peerd.protocol.messages.RELAYREC_CAPABILITY``).

The envelope's key must be the key the node id names (the id is the key, so nothing else
is trusted). ``seq`` orders one node's records: a holder keeps only the highest (libp2p
uses a timestamp in the same role). Addresses are TCP multiaddrs over an IP literal or a
DNS name, without ``/p2p/`` (the record's node says whose they are), or a member's circuit
address at a Circuit Relay v2 relay it holds a reservation on,
``<relay's TCP multiaddr>/p2p/<relay id>/p2p-circuit`` (issue 27: a member behind a NAT is
dialled through the relay; the Noise handshake still proves the member's key end to end).

Pure: ``now`` is a parameter; whether the node is a member is the caller's decision.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.reasons import Reason
from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import as_node_id, node_id_from_public_key, node_id_of
from peerd.protocol.limits import (
    FLEET_ID_LEN,
    MAX_RECORD_ADDRS,
    MAX_RECORD_BODY_LEN,
    MAX_RECORD_MULTIADDR_LEN,
    MAX_RECORD_TTL_S,
)
from peerd.protocol.wire import (
    Fields,
    as_bytes,
    as_float,
    as_int,
    as_list,
    as_str,
    malformed,
    pack,
    unpack_exact,
)

ADDRS_DOMAIN = b"peerd/addrs/v1\0"
_BODY_KEYS = frozenset({"type", "fleet", "node", "seq", "addrs", "expires"})
_RELAY_BODY_KEYS = _BODY_KEYS | {"relay"}
_HOST_PROTOCOLS = frozenset({"ip4", "ip6", "dns", "dns4", "dns6"})


def check_multiaddr(addr: str, what: str = "multiaddr") -> str:
    """``/ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT``, nothing more: the only shape the transport
    dials. An unspecified host (``0.0.0.0``, ``::``) is no destination and is refused."""
    if len(addr) > MAX_RECORD_MULTIADDR_LEN:
        malformed(f"{what} longer than {MAX_RECORD_MULTIADDR_LEN} characters")
    parts = addr.split("/")
    if len(parts) != 5 or parts[0] or parts[1] not in _HOST_PROTOCOLS or parts[3] != "tcp":
        malformed(f"{what} {addr[:64]!r} is not /ip4|ip6|dns4|dns6|dns/HOST/tcp/PORT")
    proto, host, port = parts[1], parts[2], parts[4]
    if not port.isdigit() or not 0 < int(port) < 65536 or port != str(int(port)):
        malformed(f"{what} has a bad port")
    if proto in ("ip4", "ip6"):
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            malformed(f"{what} has a bad {proto} address")
        if ip.version != (4 if proto == "ip4" else 6) or ip.is_unspecified or ip.is_multicast:
            malformed(f"{what} is no {proto} unicast address")
    elif not host or not all(c.isascii() and (c.isalnum() or c in "-.") for c in host):
        malformed(f"{what} has a bad DNS name")
    return addr


CIRCUIT_SUFFIX = "/p2p-circuit"


def is_circuit(addr: str) -> bool:
    """Whether ``addr`` has the shape of a circuit address (not yet checked)."""
    return addr.endswith(CIRCUIT_SUFFIX)


def check_circuit(addr: str, what: str = "circuit address") -> str:
    """``<check_multiaddr shape>/p2p/<relay id>/p2p-circuit``: the relay's TCP address and
    the peer id the relay must prove, then the circuit (the member's own id is the record's
    or the dialler's to add)."""
    if len(addr) > MAX_RECORD_MULTIADDR_LEN:
        malformed(f"{what} longer than {MAX_RECORD_MULTIADDR_LEN} characters")
    if not is_circuit(addr):
        malformed(f"{what} {addr[:64]!r} does not end in {CIRCUIT_SUFFIX}")
    relay, sep, relay_id = addr[: -len(CIRCUIT_SUFFIX)].rpartition("/p2p/")
    if not sep:
        malformed(f"{what} {addr[:64]!r} names no relay (/p2p/<relay id>)")
    check_multiaddr(relay, what)
    as_node_id(relay_id, f"{what}'s relay id")
    return addr


def check_record_addr(addr: str, what: str = "multiaddr") -> str:
    """An address a record may hold: a direct TCP one or a circuit address."""
    return check_circuit(addr, what) if is_circuit(addr) else check_multiaddr(addr, what)


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """A verified record (or one we signed); ``envelope`` is what is handed on, unchanged."""

    node_id: str
    seq: int
    addrs: tuple[str, ...]
    expires: float
    envelope: SignedEnvelope
    #: The subject runs a relay service (the signed ``relay`` field).
    relay: bool = False


def sign_record(key: Ed25519PrivateKey, fleet_id: bytes, *, seq: int,
                addrs: Sequence[str], expires: float, relay: bool = False) -> PeerRecord:
    """Our own record. Refuses what a receiver would refuse (ValueError: a bug of ours)."""
    if not 0 < len(addrs) <= MAX_RECORD_ADDRS:
        raise ValueError(f"a record holds 1 to {MAX_RECORD_ADDRS} addresses, got {len(addrs)}")
    if len(set(addrs)) != len(addrs):
        raise ValueError("a record names each address once")
    try:
        for a in addrs:
            check_record_addr(a)
    except ProtocolError as exc:
        raise ValueError(exc.message) from None
    node_id = node_id_of(key)
    fields: dict[str, object] = {"type": "addrs", "fleet": fleet_id, "node": node_id,
                                 "seq": seq, "addrs": list(addrs), "expires": float(expires)}
    if relay:  # absent otherwise: the body older releases sign and verify
        fields["relay"] = True
    body = pack(fields)
    if len(body) > MAX_RECORD_BODY_LEN:
        raise ValueError(f"record body of {len(body)} bytes")
    envelope = SignedEnvelope.sign(key, ADDRS_DOMAIN, fleet_id, body)
    return PeerRecord(node_id, seq, tuple(addrs), float(expires), envelope, relay)


def verify_record(envelope: SignedEnvelope, fleet_id: bytes, now: float) -> PeerRecord:
    """Check and decode a record as received: our fleet, the signature of the key its node id
    names, well-formed addresses, not expired and not expiring beyond MAX_RECORD_TTL_S from
    ``now`` (a record valid for years would outlive any address). Cheapest checks first; the
    signature before the body is decoded."""
    if len(envelope.body) > MAX_RECORD_BODY_LEN:
        raise ProtocolError(Reason.TOO_LARGE, f"address record of {len(envelope.body)} bytes")
    envelope.verify(ADDRS_DOMAIN, fleet_id)  # WRONG_FLEET / BAD_SIGNATURE
    raw_body = unpack_exact(envelope.body, MAX_RECORD_BODY_LEN)
    relay = isinstance(raw_body, dict) and "relay" in raw_body
    f = Fields(raw_body, "addrs", _RELAY_BODY_KEYS if relay else _BODY_KEYS)
    if f.get("type", as_str, 16) != "addrs":
        malformed("not an address record")
    if f.get("fleet", as_bytes, FLEET_ID_LEN) != fleet_id:
        raise ProtocolError(Reason.WRONG_FLEET, "address record of another fleet")
    node_id = f.get("node", as_node_id)
    if node_id_from_public_key(envelope.key) != node_id:
        raise ProtocolError(Reason.BAD_SIGNATURE, "address record signed by another key")
    seq = f.get("seq", as_int)
    raw = f.get("addrs", as_list, MAX_RECORD_ADDRS)
    if not raw:
        malformed("address record without an address")
    addrs = tuple(check_record_addr(as_str(a, "addrs.addrs[]", MAX_RECORD_MULTIADDR_LEN),
                                    "addrs.addrs[]") for a in raw)
    if len(set(addrs)) != len(addrs):
        malformed("address record names an address twice")
    expires = f.get("expires", as_float)
    if expires <= now:
        raise ProtocolError(Reason.EXPIRED, "address record expired")
    if expires > now + MAX_RECORD_TTL_S:
        malformed(f"address record expires more than {MAX_RECORD_TTL_S:g} s ahead")
    if relay and f.raw("relay") is not True:
        malformed("address record's relay field is not true")
    return PeerRecord(node_id, seq, addrs, expires, envelope, relay)
