"""Discovery and membership (issue 12, item 12), with no network: records go through
``handle_info`` and goodbyes through the browser callback in a foreign thread, as zeroconf's
browser thread calls them. The same over real multicast, between namespaces:
tests/net/test_discovery_members_netns.py."""

from __future__ import annotations

import threading

import trio
from zeroconf import ServiceInfo, ServiceStateChange

from peerd.net.discovery import MAX_TRACKED_SERVICES, SERVICE_TYPE, Discovery, PeerHint
from peerd.protocol.identity import node_id_of
from tests.net.test_discovery_txt import NODE_A, NODE_B

DEADLINE_S = 10.0


def _id(i: int) -> str:
    """A valid-looking node id for made-up record ``i``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return node_id_of(Ed25519PrivateKey.from_private_bytes(i.to_bytes(32, "big")))


def _record(node_id: str, address: str = "10.0.0.2") -> ServiceInfo:
    props: dict[bytes, bytes | None] = {b"id": node_id.encode(), b"fleet": b"fleet-x",
                                        b"pv": b"1", b"port": b"4001"}
    return ServiceInfo(SERVICE_TYPE, f"x.{SERVICE_TYPE}", port=4001, properties=props,
                       server="x.local.", parsed_addresses=[address])


class Seen:
    """What the discovery told the trio side, and in which thread."""

    def __init__(self) -> None:
        self.peers: list[str] = []
        self.lost: list[str] = []
        self.asked: list[str] = []
        self.trio_thread = threading.get_ident()
        self.changed = trio.Event()

    def on_peer(self, hint: PeerHint) -> None:
        assert threading.get_ident() == self.trio_thread
        self.peers.append(hint.node_id)
        self.changed.set()

    def on_lost(self, node_id: str) -> None:
        assert threading.get_ident() == self.trio_thread
        self.lost.append(node_id)
        self.changed.set()


def _discovery(seen: Seen, members: set[str]) -> Discovery:
    def is_member(node_id: str) -> bool:
        assert threading.get_ident() == seen.trio_thread  # it reads the node's manifest
        seen.asked.append(node_id)
        return node_id in members

    return Discovery(node_id=NODE_A, fleet_id="fleet-x", on_peer=seen.on_peer,
                     trio_token=trio.lowlevel.current_trio_token(), on_peer_lost=seen.on_lost,
                     is_member=is_member)


def _removed(d: Discovery, name: str) -> None:
    d._on_state_change(None, SERVICE_TYPE, name, ServiceStateChange.Removed)  # type: ignore[arg-type]


def test_records_of_non_members_are_ignored_and_take_no_tracked_name() -> None:
    # Before: every record of the fleet id was a hint, and 1,024 hostile names filled the
    # tracked names, so a genuine member arriving then was dropped (too_many_services).
    async def main() -> None:
        seen = Seen()
        d = _discovery(seen, members={NODE_B})
        hostile = MAX_TRACKED_SERVICES + 476  # 1,500 names, as in the wave

        def wave() -> None:
            for i in range(hostile):
                d.handle_info(f"h{i}.{SERVICE_TYPE}", _record(_id(i + 1)))
            d.handle_info(f"member.{SERVICE_TYPE}", _record(NODE_B))

        await trio.to_thread.run_sync(wave)
        assert seen.peers == [NODE_B]
        assert d.rejected == {"not_member": hostile}
        assert len(seen.asked) == hostile + 1

    trio.run(main)


def test_a_goodbye_reports_the_peer_lost_unless_another_record_still_names_it() -> None:
    async def main() -> None:
        seen = Seen()
        d = _discovery(seen, members={NODE_B})

        def zeroconf_thread() -> None:
            d.handle_info(f"b.{SERVICE_TYPE}", _record(NODE_B))
            # Someone copies B's id into a record of its own, then says goodbye with it:
            # B's own record still stands, so B is not lost.
            d.handle_info(f"copy.{SERVICE_TYPE}", _record(NODE_B, "10.0.0.66"))
            _removed(d, f"copy.{SERVICE_TYPE}")
            _removed(d, f"never-seen.{SERVICE_TYPE}")
            # B's own goodbye.
            _removed(d, f"b.{SERVICE_TYPE}")
            _removed(d, f"b.{SERVICE_TYPE}")  # a repeated goodbye is nothing new

        await trio.to_thread.run_sync(zeroconf_thread)
        assert seen.peers == [NODE_B, NODE_B]
        assert seen.lost == [NODE_B]

    trio.run(main)


def test_a_record_that_stops_naming_a_member_is_a_peer_lost() -> None:
    async def main() -> None:
        seen = Seen()
        members = {NODE_B}
        d = _discovery(seen, members)
        other = _id(7)

        def zeroconf_thread() -> None:
            d.handle_info(f"b.{SERVICE_TYPE}", _record(NODE_B))
            members.discard(NODE_B)  # revoked by a newer manifest; its record refreshes
            d.handle_info(f"b.{SERVICE_TYPE}", _record(NODE_B))
            members.add(other)  # the name now carries another member's id
            d.handle_info(f"o.{SERVICE_TYPE}", _record(other))
            d.handle_info(f"o.{SERVICE_TYPE}", _record(NODE_B))  # not a member any more

        await trio.to_thread.run_sync(zeroconf_thread)
        assert seen.peers == [NODE_B, other]
        assert seen.lost == [NODE_B, other]

    trio.run(main)


class _Cache:
    """What recheck() needs of zeroconf: resolving a name (from its cache)."""

    def __init__(self, records: dict[str, ServiceInfo]) -> None:
        self.records = records

    def get_service_info(self, type_: str, name: str, timeout: int) -> ServiceInfo | None:
        return self.records.get(name)


def test_a_recheck_finds_a_node_admitted_after_its_record_was_ignored() -> None:
    # A newcomer's record arrives before the manifest that admits it: ignored then. Once
    # the manifest is adopted (the daemon calls recheck), it is found without waiting for
    # the record to change.
    async def main() -> None:
        seen = Seen()
        members: set[str] = set()
        d = _discovery(seen, members)
        name = f"newcomer.{SERVICE_TYPE}"
        await trio.to_thread.run_sync(d.handle_info, name, _record(NODE_B))
        assert seen.peers == []
        assert d.rejected["not_member"] == 1
        d._zc = _Cache({name: _record(NODE_B)})  # type: ignore[assignment]
        members.add(NODE_B)
        d.recheck()
        with trio.fail_after(DEADLINE_S):
            while not seen.peers:
                seen.changed = trio.Event()
                await seen.changed.wait()
        assert seen.peers == [NODE_B]
        d.recheck()  # nothing is left to recheck: no thread, no second hint
        assert seen.peers == [NODE_B]

    trio.run(main)
