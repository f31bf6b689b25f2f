"""What READY=1 promises (issue 14, docs/operations.md): when the daemon tells systemd it is
ready, its control socket answers and reports the address the host listens on. A real
``Daemon`` on loopback (mDNS off, listen port 0), run in-process; the data of its task is
read after READY=1 (peerd.daemon.launch)."""

from __future__ import annotations

import dataclasses
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from torch import nn
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.control.server import ControlError, request
from peerd.core.local_update import LossName
from peerd.daemon import sdnotify
from peerd.daemon.daemon import Daemon
from peerd.daemon.launch import load_data
from peerd.daemon.startup import LateStartupError
from peerd.learn.data import DataError
from peerd.learn.tasks import TaskData
from tests.daemon.helpers import THREAD_WAIT_S, fleet_config

runner = CliRunner(env={"COLUMNS": "200"})


def _daemon(tmp_path: Path, **over: Any) -> Daemon:
    """A member on loopback (``over``: config sections replaced, e.g. ``learner``)."""
    fleet, state = tmp_path / "fleet", tmp_path / "st"
    assert runner.invoke(app, ["fleet", "init", str(fleet)]).exit_code == 0
    out = runner.invoke(app, ["keygen", "--state-dir", str(state)])
    found = re.search(r"12D3KooW\w+", out.stdout)
    assert found is not None, out.output
    assert runner.invoke(app, ["fleet", "admit", "--fleet", str(fleet),
                               found.group(0)]).exit_code == 0
    cfg = fleet_config(tmp_path, fleet, state, with_manifest=True)
    cfg = dataclasses.replace(cfg, network=dataclasses.replace(
        cfg.network, listen_host="127.0.0.1", listen_port=0, mdns=False), **over)
    return Daemon(cfg)


def test_ready_is_sent_once_the_control_socket_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = _daemon(tmp_path)
    socket_path = daemon.cfg.node.control_socket
    answers: list[dict[str, Any]] = []
    errors: list[ControlError] = []
    asked: list[threading.Thread] = []

    def ask() -> None:
        try:
            answers.append(request(socket_path, "status", timeout=THREAD_WAIT_S))
        except ControlError as exc:
            errors.append(exc)

    def ready() -> bool:
        # Called on the event loop at the moment READY=1 would go out: ask from another
        # thread, as `peerd status` right after `systemctl start` would.
        asked.append(threading.Thread(target=ask))
        asked[-1].start()
        return True

    monkeypatch.setattr(sdnotify, "ready", ready)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(daemon.run)
            await daemon.ready.wait()
            await trio.to_thread.run_sync(asked[0].join)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(asked) == 1
    assert errors == [], f"READY=1 before the control socket answered: {errors}"
    (status,) = answers
    assert status["node"]["id"] == daemon.node.id
    assert any(a.startswith("/ip4/127.0.0.1/tcp/") for a in status["node"]["listen"]), status


class _FailingTask:
    """A task whose model is built at once and whose data cannot be read."""

    name = "failing"
    loss: LossName = "cross_entropy"

    def model(self) -> nn.Module:
        return nn.Linear(2, 2)

    def prepare(self) -> None:
        raise DataError("the data went missing\nhalfway")

    def data(self) -> TaskData:
        self.prepare()
        raise AssertionError("unreachable")


def test_a_data_load_failure_after_ready_is_a_start_up_failure() -> None:
    async def main() -> None:
        await load_data(_FailingTask())

    with pytest.raises(LateStartupError) as caught:
        trio.run(main)
    # One line (cli/run.py prints it as `peerd: ...` and exits 2), naming the task and cause.
    assert str(caught.value) == ("task failing: cannot load its data: "
                                 "the data went missing halfway")
