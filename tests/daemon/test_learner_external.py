"""``[learner] kind = "external"`` (issue 26, item 5): a training process attached to a real
``Daemon`` object through its learner socket, with :mod:`peerd.client`.

The daemon serves its socket and runs its own round loop in one trio run
(:func:`attached`) while the client, synchronous as a user's loop is, runs in a thread:
``blend`` is the weight-mode blend of the cache as of now, a ``publish`` becomes a signed
entry a peer accepts, refused publishes are refused by name with the cache unchanged, and
a client that dies mid-frame or mid-blend leaves the daemon serving.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
import trio

import peerd.client
from peerd.core.entry import EntryMeta
from peerd.core.modes import ModeName
from peerd.core.plan import blend_plan
from peerd.daemon.config import Config, LearnerConfig
from peerd.daemon.daemon import Daemon
from peerd.daemon.external import ExternalSide
from peerd.daemon.modes.weights import WeightsMode
from peerd.learn.learner.external import learner_socket
from peerd.node.state import Held
from tests.daemon.inprocfleet import meet
from tests.daemon.modefleet import Clock, mode_configs

T = TypeVar("T")
MODEL = "tests.learn.learners:model"


def external(cfg: Config, **over: object) -> Config:
    lc = LearnerConfig(kind="external", model=MODEL, device="cpu",
                       node_config={"partition-id": 0})
    return dataclasses.replace(cfg, learner=dataclasses.replace(lc, **over))  # type: ignore[arg-type]


def side(d: Daemon) -> ExternalSide:
    assert isinstance(d.mode, WeightsMode)
    ext = d.mode.external
    assert ext is not None
    return ext


def attached(d: Daemon, client: Callable[[], T]) -> T:
    """``client()`` in a thread while ``d`` serves its learner socket and runs its round
    loop (a publish wakes it), as ``peerd run`` does; the socket is gone afterwards."""
    box: list[T] = []

    async def main() -> None:
        ext = side(d)
        async with trio.open_nursery() as nursery:
            await ext.open()
            nursery.start_soon(ext.serve)
            nursery.start_soon(d._round_loop)
            box.append(await trio.to_thread.run_sync(client))
            nursery.cancel_scope.cancel()

    trio.run(main)
    return box[0]


def pair(tmp_path: Path) -> tuple[Daemon, Daemon, Clock]:
    clock = Clock()
    a, b = (Daemon(external(c), clock=clock)
            for c in mode_configs(tmp_path, ModeName.WEIGHTS))
    return a, b, clock


def trained(params: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    return {k: v + by for k, v in params.items()}


def test_blend_is_the_cache_blend_as_of_now(tmp_path: Path) -> None:
    a, b, clock = pair(tmp_path)
    peer_model = attached(b, lambda: _publish(b, by=0.5, n=48))
    meet(a, b)  # a caches b's entry
    (item,) = a.node.cache
    assert item.meta.origin == b.node.id
    own_before = {k: v.clone() for k, v in a.model.state_dict().items()}

    def blend() -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        with peerd.client.connect(a.cfg.node.state_dir) as peer:
            x = {k: v.clone() for k, v in peer.blend().items()}
            return x, peer.last_alpha

    got, alpha = attached(a, blend)
    # α as the core plans it for this cache now (own: 1 example before any publish), and
    # x̄ = Σ α_j x_j computed here by hand.
    own_meta = EntryMeta(a.node.id, 0, clock(), "", 1, "")
    plan = blend_plan(own_meta, a.node.cache, a.node.clock(clock()), a.cfg.learning.alpha_policy)
    assert alpha == pytest.approx(plan.as_dict())
    assert 0.0 < plan.alpha[1] < 1.0
    for k, v in got.items():
        want = plan.alpha[0] * own_before[k] + plan.alpha[1] * peer_model[k]
        torch.testing.assert_close(v, want, rtol=0, atol=1e-6)
    # The daemon's own model is not the blend: only the client's buffer is.
    assert all(torch.equal(a.model.state_dict()[k], own_before[k]) for k in own_before)
    assert side(a).blends == 1

    # Past τ_max the peer's entry ages out at that moment: the blend is the own model.
    clock.t += a.cfg.learning.tau_max + 1
    got, alpha = attached(a, blend)
    assert alpha == {a.node.id: 1.0}
    assert not a.node.cache
    assert all(torch.equal(got[k], own_before[k]) for k in own_before)


def _publish(d: Daemon, *, by: float, n: int) -> dict[str, torch.Tensor]:
    """Blend, 'train' (move every coordinate by ``by``), publish; what was published."""
    with peerd.client.connect(d.cfg.node.state_dir) as peer:
        assert peer.node_id == d.node.id
        assert peer.rho == d.cfg.learning.rho
        assert peer.node_config == {"partition-id": 0}
        model = trained(peer.blend(), by)
        receipt = peer.publish(model, num_examples=n, metrics={"train_loss": 0.25,
                                                               "accuracy": 0.75})
        assert receipt.published
        assert receipt.version == d.metrics.version
        return model


def test_a_publish_becomes_a_signed_entry_a_peer_accepts(tmp_path: Path) -> None:
    a, b, _ = pair(tmp_path)
    model = attached(a, lambda: _publish(a, by=0.25, n=40))
    own = a.node.own
    assert own is not None
    assert (own.entry.meta.version, own.entry.meta.num_examples) == (1, 40)
    assert all(torch.equal(own.entry.params[k], model[k]) for k in model)
    st = a.status()
    assert st.learner is not None
    assert st.learner.kind == "external"
    assert st.learner.metrics == {"train_loss": 0.25, "accuracy": 0.75}
    assert st.node.val_accuracy == 0.75
    ext = st.learner.external
    assert ext is not None
    assert (ext.clients, ext.blends, ext.publishes, ext.last_version) == (0, 1, 1, 1)
    assert ext.last_publish is not None
    assert ext.socket == str(learner_socket(a.cfg.node.state_dir))
    meet(a, b)
    cached = {i.meta.origin: i for i in b.node.cache}
    assert cached[a.node.id].meta.version == 1  # b verified a's signature and kept it
    assert cached[a.node.id].verified
    held = b.node.blend_inputs()
    assert all(torch.equal(held[0].params[k], model[k]) for k in model)
    b.node.release()
    records = a.participation.answer(None)["records"]
    assert [r["published"] for r in records][-1] == 1


@pytest.mark.parametrize(("bad", "reason"), [
    ("nan", "non_finite"), ("shape", "schema"), ("negative", "examples"),
    ("metric", "non_finite")])
def test_a_bad_publish_is_refused_by_name_and_changes_nothing(
        tmp_path: Path, bad: str, reason: str) -> None:
    a, b, _ = pair(tmp_path)
    attached(a, lambda: _publish(a, by=0.1, n=10))
    version = a.metrics.version
    own = {k: v.clone() for k, v in a.model.state_dict().items()}

    def publish_bad() -> peerd.client.PublishRefusedError:
        with peerd.client.connect(a.cfg.node.state_dir) as peer:
            model = trained(peer.blend(), 1.0)
            n, metrics = 10, {"train_loss": 0.5}
            if bad == "nan":
                model["weight"][0, 0] = float("nan")
            elif bad == "shape":
                model["weight"] = torch.zeros(2, 2)
            elif bad == "negative":
                n = -3
            else:
                metrics["train_loss"] = float("inf")
            with pytest.raises(peerd.client.PublishRefusedError) as caught:
                peer.publish(model, num_examples=n, metrics=metrics)
            # The connection is still good after a refusal.
            peer.blend()
            return caught.value

    err = attached(a, publish_bad)
    assert err.reason == reason
    assert a.metrics.version == version
    assert all(torch.equal(a.model.state_dict()[k], own[k]) for k in own)
    stats = a.status().learner
    assert stats is not None
    assert stats.failed[reason] == 1
    assert sum(stats.failed.values()) == 1
    assert stats.last_failure == reason
    assert a.state.audit_path.read_text().count('"learner_failed"') == 1
    meet(a, b)
    assert {i.meta.origin: i.meta.version for i in b.node.cache}[a.node.id] == version


DIES = """
import os, signal, socket, struct, sys
from peerd.learn.learner import external, wire
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(wire.frame({"op": "hello", "api": 1}))
sock.recv(1 << 20)
if sys.argv[2] == "mid-frame":
    sock.sendall(struct.pack(">I", 5000) + b'{"op": "pub')   # half a frame
else:  # mid-blend: ask for a blend into a buffer, die before the answer
    fd = external.new_buffer(int(sys.argv[3]))
    external.seal(fd, external.BLEND_SEALS)
    import array
    sock.sendmsg([wire.frame({"op": "blend"})],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_client_killed_mid_transfer_leaves_the_daemon_serving(tmp_path: Path) -> None:
    a, _, _ = pair(tmp_path)
    path = learner_socket(a.cfg.node.state_dir)
    from peerd.learn.learner.wire import layout
    size = layout(side(a).schema)[1]

    def clients() -> int:
        for how in ("mid-frame", "mid-blend"):
            proc = subprocess.run([sys.executable, "-c", DIES, str(path), how, str(size)],
                                  check=False, timeout=60)
            assert proc.returncode == -9
        # Served on: a fresh client blends and publishes; status answers.
        _publish(a, by=0.1, n=5)
        deadline = time.monotonic() + 10.0  # the daemon sees the last client's end of file
        while side(a).clients and time.monotonic() < deadline:
            time.sleep(0.05)
        return side(a).clients

    assert attached(a, clients) == 0  # the dead ones' connections are gone
    assert a.metrics.version == 1
    assert a.status().learner is not None


def test_clear_errors_not_running_wrong_kind_and_another_users_socket(tmp_path: Path) -> None:
    a, _, _ = pair(tmp_path)
    state = a.cfg.node.state_dir
    with pytest.raises(peerd.client.NotRunningError, match="no learner socket"):
        peerd.client.connect(state)
    # A daemon of another kind answers on its control socket: the client says which kind.
    from peerd.daemon.config import default_socket
    from tests.daemon.helpers import running_server
    with running_server(default_socket(state)), \
            pytest.raises(peerd.client.WrongKindError, match='kind = "builtin"'):
        peerd.client.connect(state)

    def modes() -> int:
        return stat.S_IMODE(learner_socket(state).lstat().st_mode)

    assert attached(a, modes) == 0o600  # the control socket's rule: owner only


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_is_refused_the_socket() -> None:
    # A root every user may traverse (pytest's own is 0700): only the socket's mode decides.
    root = Path(tempfile.mkdtemp(prefix="peerd-ext-", dir="/tmp"))
    try:
        _another_user(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _another_user(root: Path) -> None:
    from tests.control.test_control import as_nobody

    os.chmod(root, 0o755)
    a, _, _ = pair(root)
    state = a.cfg.node.state_dir
    os.chmod(state, 0o755)

    def refused() -> bool:
        try:
            peerd.client.connect(state)
        except peerd.client.PermissionDeniedError:
            return True
        return False

    assert attached(a, lambda: as_nobody(refused))
    def owner() -> str:
        with peerd.client.connect(state) as peer:  # its owner may
            return peer.node_id

    assert attached(a, owner) == a.node.id


def _own(d: Daemon) -> Held | None:
    return d.node.own


def test_a_round_without_a_publish_publishes_nothing(tmp_path: Path) -> None:
    a, _, clock = pair(tmp_path)
    trio.run(a._round)
    assert a.node.own is None  # nothing trained, nothing to sign
    assert a.metrics.version == 0
    attached(a, lambda: _publish(a, by=0.1, n=5))
    trio.run(a._round)
    assert a.metrics.version == 1  # no new publish: no new version
    clock.t += a.cfg.learning.silence_limit_s + 1
    trio.run(a._round)
    again = _own(a)  # (a call: mypy keeps `a.node.own is None` from above)
    assert again is not None
    assert again.entry.meta.version == 2  # overdue: the same model signed again
    assert again.entry.meta.num_examples == 5


def test_clients_beyond_the_cap_are_told_busy(tmp_path: Path) -> None:
    from peerd.learn.learner.external import MAX_CLIENTS

    a, _, _ = pair(tmp_path)
    state = a.cfg.node.state_dir

    def crowd() -> str:
        held = [peerd.client.connect(state) for _ in range(MAX_CLIENTS)]
        try:
            with pytest.raises(peerd.client.BusyError, match=f"{MAX_CLIENTS} clients"):
                peerd.client.connect(state)
            held.pop().close()
            deadline = time.monotonic() + 10.0
            while side(a).clients == MAX_CLIENTS and time.monotonic() < deadline:
                time.sleep(0.05)
            with peerd.client.connect(state) as peer:  # room again
                return peer.node_id
        finally:
            for peer in held:
                peer.close()

    assert attached(a, crowd) == a.node.id


def test_a_learner_socket_path_too_long_stops_start_up_in_one_line(tmp_path: Path) -> None:
    from peerd.daemon.startup import DaemonError

    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    (cfg,) = mode_configs(deep, ModeName.WEIGHTS, n=1)
    with pytest.raises(DaemonError, match=r'^\[learner\] kind = "external": the learner socket '
                                          r'.*learner\.sock is longer than 107 bytes; choose a '
                                          r'shorter \[node\] state_dir$'):
        Daemon(external(cfg))


def test_peerd_run_serves_the_learner_socket_from_ready_to_stop(tmp_path: Path) -> None:
    # The whole daemon (libp2p host on loopback, control socket, round loop): the learner
    # socket answers once READY=1 is out, a publish is signed by a round it wakes (the
    # round interval is far longer than the test), status over the control socket shows
    # it, and the socket is gone once the daemon stopped.
    from peerd.control.server import request_status
    from tests.daemon.test_ready import _daemon

    d = _daemon(tmp_path, learner=LearnerConfig(kind="external", model=MODEL, device="cpu",
                                                node_config={"partition-id": 0}))
    d.cfg = dataclasses.replace(d.cfg, learning=dataclasses.replace(d.cfg.learning,
                                                                    round_interval_s=3600.0))
    path = learner_socket(d.cfg.node.state_dir)

    def client() -> None:
        _publish(d, by=0.2, n=12)
        status = request_status(d.cfg.node.control_socket)
        assert status.learner is not None
        ext = status.learner.external
        assert ext is not None
        assert (ext.publishes, ext.last_version) == (1, 1)
        assert status.node.published_version == 1

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.run)
            await d.ready.wait()
            assert path.exists()
            await trio.to_thread.run_sync(client)
            nursery.cancel_scope.cancel()

    trio.run(main)
    own = d.node.own
    assert own is not None
    assert own.entry.meta.num_examples == 12
    assert not path.exists()
