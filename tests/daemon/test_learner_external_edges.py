"""The external learner socket's edge paths (issue 26, item 5): a publish that no round takes
in time, a second publish while one waits, and buffers that are not sealed as the protocol
requires. Each leaves the daemon serving and changes nothing it holds.

The daemon side runs in one trio run as in ``test_learner_external.attached``, but the
round loop is started only when a test says so: without it a publish waits for a round that
does not come.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
import trio

import peerd.client
import peerd.daemon.external
from peerd.core.modes import ModeName
from peerd.daemon.daemon import Daemon
from peerd.learn.learner.external import BLEND_SEALS, map_fd, new_buffer, seal
from peerd.learn.learner.wire import layout, schema_to_json, write_into
from tests.daemon.modefleet import Clock, mode_configs
from tests.daemon.test_learner_external import external, side, trained

T = TypeVar("T")


def daemon(tmp_path: Path) -> Daemon:
    (cfg,) = mode_configs(tmp_path, ModeName.WEIGHTS, n=1)
    return Daemon(external(cfg), clock=Clock())


def served(d: Daemon, client: Callable[[trio.Event], T]) -> T:
    """``client(rounds)`` in a thread while ``d`` serves its learner socket; its round loop
    starts once the client sets ``rounds`` (from its thread, via ``trio.from_thread``)."""
    box: list[T] = []

    async def main() -> None:
        ext, rounds = side(d), trio.Event()
        async with trio.open_nursery() as nursery:
            await ext.open()
            nursery.start_soon(ext.serve)

            async def loop_when_asked() -> None:
                await rounds.wait()
                await d._round_loop()

            nursery.start_soon(loop_when_asked)
            box.append(await trio.to_thread.run_sync(client, rounds))
            nursery.cancel_scope.cancel()

    trio.run(main)
    return box[0]


def test_a_publish_no_round_takes_fails_in_time_a_second_is_busy_and_the_next_is_signed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The daemon's 600 s bound, shortened: what matters is that the wait ends and says so.
    monkeypatch.setattr(peerd.daemon.external, "PUBLISH_WAIT_S", 1.0)
    d = daemon(tmp_path)
    state = d.cfg.node.state_dir

    def client(rounds: trio.Event) -> tuple[str, str, int | None]:
        with peerd.client.connect(state) as first, peerd.client.connect(state) as second:
            model = trained(first.blend(), 0.1)
            outcome: list[BaseException] = []

            def wait() -> None:
                try:
                    first.publish(model, num_examples=8)
                except peerd.client.ClientError as exc:
                    outcome.append(exc)

            waiting = threading.Thread(target=wait)
            waiting.start()
            deadline = time.monotonic() + 10.0
            while side(d)._pending is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert side(d)._pending is not None, "the first publish never arrived"
            with pytest.raises(peerd.client.BusyError, match="waiting for its round") as busy:
                second.publish(model, num_examples=8)
            waiting.join(timeout=30)
            assert not waiting.is_alive()
            (late,) = outcome
            assert isinstance(late, peerd.client.ClientError)
            assert d.metrics.version == 0
            assert d.node.own is None
            trio.from_thread.run_sync(rounds.set)  # now rounds run: the next publish is taken
            receipt = second.publish(model, num_examples=8)
            return busy.value.code, late.code, receipt.version

    busy, late, version = served(d, client)
    assert busy == "busy"
    assert late == "round_failed"
    assert version == 1
    assert d.metrics.version == 1
    own = d.node.own
    assert own is not None
    assert own.entry.meta.num_examples == 8


def test_buffers_not_sealed_as_required_are_refused_and_change_nothing(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    before = {k: v.clone() for k, v in d.model.state_dict().items()}

    def client(_rounds: trio.Event) -> tuple[str, str, str]:
        with peerd.client.connect(d.cfg.node.state_dir) as peer:
            size = layout(peer.schema)[1]
            model = trained(peer.blend(), 1.0)
            # A publish buffer still writable (no F_SEAL_WRITE): the client could change the
            # bytes after the daemon checked them, so the daemon must not take it.
            fd = new_buffer(size)
            try:
                view = map_fd(fd, peer.schema, shared=True)
                write_into(view, model, list(peer.schema))
                del view
                seal(fd, BLEND_SEALS)
                request = {"op": "publish", "schema": schema_to_json(peer.schema),
                           "num_examples": 8, "metrics": {}}
                with pytest.raises(peerd.client.PublishRefusedError) as refused:
                    peer._call(request, fd, 30.0)
            finally:
                os.close(fd)
            # A blend buffer that could still shrink under the daemon's mapping (SIGBUS).
            fd = new_buffer(size)
            try:
                with pytest.raises(peerd.client.ClientError) as bad:
                    peer._call({"op": "blend"}, fd, 30.0)
            finally:
                os.close(fd)
            peer.blend()  # the connection is still good
            return refused.value.reason, str(refused.value), bad.value.code

    reason, message, blend_code = served(d, client)
    assert reason == "malformed"
    assert "not sealed" in message
    assert blend_code == "bad_request"
    assert d.metrics.version == 0
    assert d.node.own is None
    assert all(torch.equal(d.model.state_dict()[k], before[k]) for k in before)
    stats = d.status().learner
    assert stats is not None
    assert stats.failed["malformed"] == 1
    assert sum(stats.failed.values()) == 1
    assert side(d).blends == 2  # the refused blend did not count
