"""TXT-record validation and the zeroconf-thread -> trio hop, with no network at all."""

from __future__ import annotations

import threading

import pytest
import trio
from zeroconf import ServiceInfo

from peerd.net.discovery import SERVICE_TYPE, Discovery, PeerHint
from peerd.net.txtrecord import MalformedRecordError, build_txt, parse_txt

NODE_A = "12D3KooWKLkxBiLiQJ2MSVRjTPgSffFEWK83RhZtyRnHDEzoi7gZ"
NODE_B = "12D3KooWHrSJFRHKPKfFrEJFS3wxJZoR6V95nzTRkHsnQ1MxDjz4"
GOOD: dict[bytes, bytes | None] = {
    b"id": NODE_B.encode(), b"fleet": b"fleet-x", b"pv": b"1", b"port": b"4001"
}


def test_valid_record() -> None:
    f = parse_txt(GOOD)
    assert (f.node_id, f.fleet_id, f.protocol_version, f.port) == (NODE_B, "fleet-x", 1, 4001)
    assert parse_txt(build_txt(NODE_B, "fleet-x", 4001, 1)) == f


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({b"id": None}, "missing_key"),
        ({b"fleet": None}, "missing_key"),
        ({b"port": None}, "missing_key"),
        ({b"pv": None}, "missing_key"),
        ({b"id": b"1" * 65}, "too_long"),
        ({b"fleet": b"f" * 65}, "too_long"),
        ({b"port": b"123456"}, "too_long"),
        ({b"pv": b"9" * 4000}, "too_long"),
        ({b"id": b"\xff\xfe" * 20}, "bad_utf8"),
        ({b"fleet": b"fleet-\xc3"}, "bad_utf8"),
        ({b"id": b"short"}, "bad_node_id"),
        ({b"id": b"0OIl" * 10}, "bad_node_id"),  # not base58
        ({b"fleet": b""}, "bad_fleet_id"),
        ({b"fleet": b"a b"}, "bad_fleet_id"),
        ({b"fleet": "fl\u00e9et".encode()}, "bad_fleet_id"),
        ({b"port": b"0"}, "bad_port"),
        ({b"port": b"65536"}, "bad_port"),
        ({b"port": b"-1"}, "bad_port"),
        ({b"port": b" 80"}, "bad_port"),
        ({b"port": "\u0663\u0663".encode()}, "bad_port"),  # Arabic-Indic digits
        ({b"port": b""}, "bad_port"),
        ({b"pv": b"1.0"}, "bad_version"),
        ({b"pv": b"+1"}, "bad_version"),
    ],
)
def test_hostile_records_rejected_with_reason(
    change: dict[bytes, bytes | None], reason: str
) -> None:
    # None in the table means: the key is absent altogether.
    props = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(MalformedRecordError) as info:
        parse_txt(props)
    assert info.value.reason == reason


def test_key_without_value_is_missing() -> None:
    # "port" with no "=" decodes to {b"port": None} in zeroconf.
    with pytest.raises(MalformedRecordError) as info:
        parse_txt({**GOOD, b"port": None})
    assert info.value.reason == "missing_key"


def test_we_refuse_to_publish_garbage() -> None:
    with pytest.raises(MalformedRecordError):
        build_txt("not a peer id", "fleet-x", 4001, 1)
    with pytest.raises(MalformedRecordError):
        build_txt(NODE_A, "fleet-x", 0, 1)


def _info(props: dict[bytes, bytes | None] | bytes, addresses: list[str]) -> ServiceInfo:
    return ServiceInfo(
        SERVICE_TYPE,
        f"x.{SERVICE_TYPE}",
        port=4001,
        properties=props,
        server="x.local.",
        parsed_addresses=addresses,
    )


def test_handle_info_filters_and_hops_into_trio() -> None:
    """Records go through handle_info in a foreign thread, as zeroconf's browser does."""
    delivered: list[tuple[PeerHint, bool]] = []
    raw_txt_garbage = [
        b"\x30id=abc",  # length byte runs past the end of the data
        b"\x00\x00\x00",  # empty strings
        b"\xff" + b"\xfe" * 255,  # one 255-byte non-UTF-8 string
        b"\x05port=\x03pv=",  # keys with empty values
    ]
    records: list[ServiceInfo] = [
        _info({**GOOD, b"fleet": b"fleet-other"}, ["10.0.0.2"]),  # other fleet
        _info({**GOOD, b"id": NODE_A.encode()}, ["10.0.0.1"]),  # our own record
        _info({**GOOD, b"port": b"x"}, ["10.0.0.2"]),  # bad port
        _info({b"id": NODE_B.encode()}, ["10.0.0.2"]),  # missing keys
        _info(GOOD, []),  # no address
        *(_info(raw, ["10.0.0.2"]) for raw in raw_txt_garbage),
        _info(GOOD, [f"10.0.0.{i}" for i in range(2, 40)]),  # the one good record
    ]

    async def main() -> None:
        trio_thread = threading.get_ident()

        def on_peer(hint: PeerHint) -> None:
            delivered.append((hint, threading.get_ident() == trio_thread))

        d = Discovery(
            node_id=NODE_A, fleet_id="fleet-x", on_peer=on_peer,
            trio_token=trio.lowlevel.current_trio_token(),
        )

        def zeroconf_thread() -> None:
            for i, info in enumerate(records):
                d.handle_info(f"n{i}.{SERVICE_TYPE}", info)

        await trio.to_thread.run_sync(zeroconf_thread)
        assert d.rejected["other_fleet"] == 1
        assert d.rejected["own_record"] == 1
        assert d.rejected["bad_port"] == 1
        assert d.rejected["no_address"] == 1
        # Every raw-garbage TXT and the key-less one were refused, whatever the reason.
        refused = sum(d.rejected.values())
        assert refused == 4 + 1 + len(raw_txt_garbage)

    trio.run(main)
    assert len(delivered) == 1
    hint, in_trio_thread = delivered[0]
    assert in_trio_thread
    assert hint.node_id == NODE_B
    assert hint.port == 4001
    assert len(hint.addresses) == 8  # capped
    assert hint.multiaddrs[0] == "/ip4/10.0.0.2/tcp/4001"


def test_callback_errors_and_late_records_do_not_escape() -> None:
    def boom(hint: PeerHint) -> None:
        raise RuntimeError("bug in the gossip layer")

    token_holder: list[Discovery] = []

    async def main() -> None:
        d = Discovery(
            node_id=NODE_A, fleet_id="fleet-x", on_peer=boom,
            trio_token=trio.lowlevel.current_trio_token(),
        )
        token_holder.append(d)
        await trio.to_thread.run_sync(
            d.handle_info, "n." + SERVICE_TYPE, _info(GOOD, ["10.0.0.2"])
        )

    trio.run(main)
    # trio has finished: a record arriving now must be dropped quietly, not raise.
    token_holder[0].handle_info("m." + SERVICE_TYPE, _info(GOOD, ["10.0.0.3"]))
