"""``[network] relay_service`` (issue 27 item 2): the key parses, and a daemon with it on runs
peerd.net.relay on its own host, so a member reserves a slot there and another member dials
it through the circuit. A real ``Daemon`` on loopback (mDNS off, port 0), run in-process."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import trio
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.daemon.config import loads_config
from peerd.daemon.daemon import Daemon
from peerd.net.relay import fleet_namespace
from peerd.store.keyfile import NODE_KEY_FILE, read_private_key
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX, fleet_config
from tests.net.relayhosts import relay_clients

runner = CliRunner(env={"COLUMNS": "200"})


def test_relay_service_is_off_unless_asked() -> None:
    fleet = {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX}
    assert loads_config({"fleet": fleet}).network.relay_service is False
    on = loads_config({"fleet": fleet, "network": {"relay_service": True}})
    assert on.network.relay_service is True


def _member(tmp_path: Path, fleet: Path, name: str) -> Path:
    state = tmp_path / name
    out = runner.invoke(app, ["keygen", "--state-dir", str(state)])
    found = re.search(r"12D3KooW\w+", out.stdout)
    assert found is not None, out.output
    assert runner.invoke(app, ["fleet", "admit", "--fleet", str(fleet),
                               found.group(0)]).exit_code == 0
    return state


def test_a_daemon_with_relay_service_answers_a_reservation(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    assert runner.invoke(app, ["fleet", "init", str(fleet)]).exit_code == 0
    state = _member(tmp_path, fleet, "st")
    members = [read_private_key(_member(tmp_path, fleet, n) / NODE_KEY_FILE) for n in "ab"]
    cfg = fleet_config(tmp_path, fleet, state, with_manifest=True)
    cfg = dataclasses.replace(cfg, network=dataclasses.replace(
        cfg.network, listen_host="127.0.0.1", listen_port=0, mdns=False, relay_service=True))
    daemon = Daemon(cfg)

    async def main() -> None:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(daemon.run)
                await daemon.ready.wait()
                assert daemon.relay is not None
                assert daemon.transport is not None
                relay = daemon.transport.host
                rid, addr = relay.get_id(), f"/ip4/127.0.0.1/tcp/{daemon.transport.port}"
                assert HOP_ID in relay.get_mux().get_protocols()
                async with relay_clients(2, members) as (a, b):
                    assert await a.reserve(rid, addr)
                    await b.dial(rid, addr, a.peer_id)
                    conns = b.transport.host.get_network().connections.get(a.peer_id, [])
                    assert any("p2p-circuit" in str(c.get_transport_addresses()) for c in conns)
                    stats = daemon.relay.stats()
                    assert stats.reservations >= 1
                    assert stats.circuits == 1
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert fleet_namespace(cfg.fleet.fleet_id) == f"peerd/{cfg.fleet.fleet_id.hex()}"
