"""Dialling a member that may be reached directly or through relays (issue 27): its direct
addresses get a head start, then its circuits are dialled beside them, and the first
connection made wins (the other dial is cancelled) — happy eyeballs between a path that may
not exist (an address private to another site, whose SYN a NAT drops) and one that does.

Circuits are tried one after another, in the order :func:`rank_circuits` gives: a relay we
hold a reservation at answers at once; one of ours that we cannot reach now (dead, or
restarting) is tried last, so a dead relay's circuit, left in a peer's record or its
rendezvous registration, does not hold the dial for its timeout while another relay works.

Used by :class:`peerd.net.relayclient.RelayClient`, which knows the reservations; nothing
here decides who may be dialled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from peerd.net.transport import Transport, TransportError

logger = logging.getLogger("peerd.net.relayclient")  # one logger for the relay client's lines

#: Deadline of one dial through a relay (the relay's CONNECT, then Noise and Yamux).
CIRCUIT_DIAL_TIMEOUT_S = 15.0
#: Deadline of the direct addresses when a circuit is there to fall back on: a NAT drops the
#: SYN of an address that is private to another site, and waiting out TCP's own timeout
#: (minutes) would hold the one path that works.
DIRECT_FIRST_TIMEOUT_S = 5.0
#: Head start of the direct addresses before the circuits are dialled beside them. Waiting
#: out DIRECT_FIRST_TIMEOUT_S before any circuit was most of the time members of two NAT'd
#: sites took to meet again after a relay restart (bench_relay_restart, docs/reliability.md);
#: a direct path that answers within this (a LAN's or a WAN's handshake) still wins.
DIRECT_HEAD_START_S = 1.0
#: How often a dial whose circuits failed looks for a reservation made anew meanwhile.
RECHECK_S = 0.25
#: Passes over the circuits of one dial at most, CIRCUIT_RETRY_S apart after the first:
#: after a relay restart the peer's reservation there may come a second or two after ours.
MAX_CIRCUIT_PASSES, CIRCUIT_RETRY_S = 4, 1.0


def circuit_relay(circuit: str) -> str:
    """The relay id of ``…/p2p/<relay>/p2p-circuit[/…]`` ('' when there is none)."""
    return circuit.split("/p2p-circuit")[0].rpartition("/p2p/")[2]


def rank_circuits(circuits: Sequence[str], held: Collection[str],
                  ours: Collection[str]) -> list[str]:
    """``circuits`` in the order to dial them: through a relay in ``held`` (we hold a
    reservation there: connected, it answers) first, then through relays not in ``ours``
    (the configured ones), then through ours that are not held now. Stable within each."""
    def rank(circuit: str) -> int:
        relay = circuit_relay(circuit)
        return 0 if relay in held else 2 if relay in ours else 1

    return sorted(circuits, key=rank)


async def dial(t: Transport, dialer: CircuitV2Transport | None, peer_id: str,
               direct: Sequence[str], circuits: Sequence[str],
               held: Callable[[], Collection[str]] = frozenset,
               head_start_s: float | None = None) -> bool:
    """A connection to ``peer_id`` (module docstring). TransportError when none was made.

    ``held()``: the relays where we hold a reservation now. A circuit through a relay that
    we held no reservation at when it failed is dialled again if one is held before the
    direct addresses are done: a dial begun while a relay restarted would otherwise fail
    as a whole after the direct deadline, and the peer be backed off, just after the
    relay came back (bench_relay_restart's logs showed it).

    ``head_start_s``: the direct addresses' (None: :data:`DIRECT_HEAD_START_S`). True when
    the connection made is a circuit."""
    if not circuits:
        await t.connect(peer_id, direct)
        return False
    if dialer is None:
        raise TransportError(f"no relay client running to dial {peer_id} through a relay")
    errors: list[str] = []
    direct_over = trio.Event()
    relayed = False

    async def via_direct(done: trio.CancelScope) -> None:
        try:
            await t.connect(peer_id, direct, timeout_s=DIRECT_FIRST_TIMEOUT_S)
            done.cancel()
        except TransportError as exc:
            errors.insert(0, str(exc))
        finally:
            direct_over.set()

    async def via_circuits(done: trio.CancelScope) -> None:
        nonlocal relayed
        with trio.move_on_after(DIRECT_HEAD_START_S if head_start_s is None else head_start_s):
            await direct_over.wait()
        todo, passes, held_when_tried = list(circuits), 0, {}
        last_pass = trio.current_time()
        while True:
            if todo:
                now = set(held())
                held_when_tried.update({c: circuit_relay(c) in now for c in todo})
                if await _dial_circuits(t, dialer, peer_id, todo, errors):
                    relayed = True
                    done.cancel()
                    return
                passes, last_pass = passes + 1, trio.current_time()
            over = direct_over.is_set()
            if over:
                await trio.sleep(RECHECK_S)
            else:
                with trio.move_on_after(RECHECK_S):
                    await direct_over.wait()
            now, again = set(held()), passes < MAX_CIRCUIT_PASSES and \
                trio.current_time() - last_pass >= CIRCUIT_RETRY_S
            # Through a relay held now: a circuit that failed while it was not, or (a few
            # passes, spaced) one whose peer may be reserving there again too.
            todo = [c for c in circuits if circuit_relay(c) in now
                    and (not held_when_tried.get(c) or again)]
            if over and not todo and (passes >= MAX_CIRCUIT_PASSES or not any(
                    circuit_relay(c) in now for c in circuits)):
                return

    async with trio.open_nursery() as nursery:
        if direct:
            nursery.start_soon(via_direct, nursery.cancel_scope)
        else:
            direct_over.set()
        nursery.start_soon(via_circuits, nursery.cancel_scope)
    if not t.is_connected(peer_id):
        raise TransportError(f"dial to {peer_id} failed: {'; '.join(errors)}")
    return relayed


async def _dial_circuits(t: Transport, dialer: CircuitV2Transport, peer_id: str,
                         circuits: Sequence[str], errors: list[str]) -> bool:
    """One circuit after another until a connection is made (True)."""
    pid = ID.from_base58(peer_id)
    for circuit in circuits:
        # The dial tries circuits of the peerstore first: only this one, then. (A direct
        # dial running beside it may find the peerstore cleared under it and fail that
        # address: only after its head start, when it has most likely failed already.)
        t.host.get_peerstore().clear_addrs(pid)
        try:
            with trio.fail_after(CIRCUIT_DIAL_TIMEOUT_S):
                await dialer.dial(multiaddr.Multiaddr(f"{circuit}/p2p/{peer_id}"))
        except trio.TooSlowError:
            errors.append(f"{circuit}: timed out")
            continue
        except Exception as exc:  # noqa: BLE001 - the relayed dial raises many types
            errors.append(f"{circuit}: {exc}")
            continue
        if t.is_connected(peer_id):
            logger.debug("connected to %s through %s", peer_id, circuit)
            return True
        errors.append(f"{circuit}: no connection")
    return False
