"""Shared test helpers: a real control server on a trio loop in a background thread, and a
daemon configuration for a fleet made by `peerd fleet init`."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from peerd.control.server import ControlServer, StatusProvider
from peerd.control.status import CacheRow, ConfigStatus, NodeStatus, PeerRow, Status
from peerd.daemon.config import Config, load_config

ADMIN_HEX = "11" * 32
FLEET_HEX = "22" * 16
#: How long a test waits for the server thread to bind or stop: far above the real ~10 ms.
THREAD_WAIT_S = 10.0


def sample_status(round_: int = 3) -> Status:
    """A status with every field set, as a daemon one peer in reach shows it (issue 4)."""
    return Status(
        node=NodeStatus(id="12D3KooWself", fleet=FLEET_HEX, round=round_, version=7,
                        examples=180, train_loss=0.42, val_loss=0.47, val_accuracy=0.91,
                        own_alpha=0.5, published_version=7, manifest_seq=2,
                        listen=("/ip4/10.0.0.1/tcp/4011",), bytes_in=1234, bytes_out=5678,
                        membership="member"),
        config=ConfigStatus(tau_max=600.0, staleness="time", capacity=10, rho=0.01,
                            local_steps=10, alpha="uniform", epsilon=0.0, max_silence_s=300.0,
                            round_interval_s=10.0, task="digits", mode="weights",
                            blend="weighted", local_policy="plain"),
        cache=(CacheRow(origin="12D3KooWpeer", version=5, created_at=1_800_000_000.0,
                        age_s=12.5, staleness=12.5, examples=170, alpha=0.5, drift=0.03,
                        received_from="12D3KooWpeer", received_at=1_800_000_001.0,
                        verified=True),),
        peers=(PeerRow(id="12D3KooWpeer", addrs=("/ip4/10.0.0.2/tcp/4011",), connected=True,
                       last_seen=1_800_000_002.0, bytes_in=1234, bytes_out=5678,
                       budget_refusals=0, source="mdns", sessions=3, last_error=None,
                       failures=2, retry_in_s=37.4),),
        accepted=1,
        rejected={"bad_signature": 2, "stale": 1},
        dropped={},
        flagged=(),
    )


def fleet_config(tmp_path: Path, fleet: Path, state: Path, *,
                 with_manifest: bool = False) -> Config:
    """A configuration with the ``[fleet]`` section only (from ``fleet/fleet.json``; with
    ``with_manifest``, its signed manifest too), written to ``tmp_path/peerd.toml``, for a
    node whose state directory is ``state``."""
    info = json.loads((fleet / "fleet.json").read_text())
    manifest = f'manifest = "{fleet / "manifest.peerd"}"\n' if with_manifest else ""
    cfg_file = tmp_path / "peerd.toml"
    cfg_file.write_text(f'[fleet]\nadmin_public_key = "{info["admin_public_key"]}"\n'
                        f'fleet_id = "{info["fleet_id"]}"\n{manifest}')
    cfg = load_config(cfg_file)
    return dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, state_dir=state))


@contextmanager
def running_server(path: Path, provider: StatusProvider | None = None,
                   **kwargs: Any) -> Iterator[ControlServer]:
    """Run a ControlServer at ``path`` until the block ends; errors at bind are re-raised."""
    status = sample_status()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        try:
            server = await ControlServer.open(path, provider or (lambda: status), **kwargs)
        except BaseException as exc:
            box["error"] = exc
            started.set()
            raise
        box["server"] = server
        box["token"] = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            box["cancel"] = nursery.cancel_scope.cancel
            started.set()
            nursery.start_soon(server.serve)

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread via box
            box.setdefault("error", exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(THREAD_WAIT_S), "control server did not start"
    if "error" in box:
        thread.join(THREAD_WAIT_S)
        raise box["error"]
    try:
        yield box["server"]
    finally:
        trio.from_thread.run_sync(box["cancel"], trio_token=box["token"])
        thread.join(THREAD_WAIT_S)
        assert not thread.is_alive(), "control server thread did not stop"
