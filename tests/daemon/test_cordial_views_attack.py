"""Who may speak for an agent (issue 24 item 2), between real sensor ``Daemon`` objects.

Three sensor agents gossip their views in memory; a fourth fleet member M, bound to no agent,
signs views into cache group ``agent-1``. Before the manifest bound agents, agent 0 fed them
to its Λ_1^0 as agent 1's h_1 (64 rows of +10: loss 0.018 -> 3e8). Now they are refused as
``agent_not_bound`` before they reach the cache, agent 0 keeps using the real agent 1's view
and its loss stays near its clean run's. Agent 1's own key signing a view far larger than its
recent ones is refused at use as ``view_too_large``; one within that bound that still blows
the round's loss up is refused as ``view_raises_loss`` and the round runs without it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import trio

from peerd.cli.app import app
from peerd.core.reasons import Reason
from peerd.core.timebuckets import VIEW_IDS, bucket_of
from peerd.daemon.daemon import Daemon
from peerd.daemon.modes.cordial import agent_of
from peerd.learn.linearproblem import M_OUT
from peerd.net.gossip import SessionContext
from peerd.node.knowstate import KnowledgeState, sign_own_view
from peerd.store.keyfile import read_private_key
from tests.daemon import test_sensor_mode
from tests.daemon.test_daemon_membership import _keygen
from tests.daemon.test_sensor_mode import BUCKET_S, Clock, _configs, _mode, runner
from tests.net.test_gossip import session

ROUNDS = 10
#: The sensor daemons' window (benchmarks/cordial_views.py sets both to measure others).
WINDOW: int = test_sensor_mode.WINDOW
#: The attacker's version: above anything an honest agent reaches in these rounds, so its
#: view is the freshest of group agent-1 whenever it is held.
ATTACK_VERSION = 10_000


def _attacker(tmp_path: Path) -> Path:
    """A fourth member of the fleet, admitted without --agent: it speaks for no agent."""
    state = tmp_path / "mallory"
    node_id = _keygen(state)
    out = runner.invoke(app, ["fleet", "admit", "--fleet", str(tmp_path / "fleet"), node_id])
    assert out.exit_code == 0, out.output
    return state


def _inject(node: KnowledgeState, key_state: Path, *, group: str, version: int, now: float,
            ids: npt.NDArray[np.int64], value: float) -> Reason | None:
    """Sign a view with the key in ``key_state`` and hand it to ``node`` as gossip would:
    admission (signature, membership, schema), then the cache's accept."""
    key = read_private_key(key_state / "node.key")
    vectors = np.full((len(ids), M_OUT), value, dtype=np.float32)
    held = sign_own_view(key, node.fleet_id, node.knowledge, version=version, created_at=now,
                         ids=ids.astype(np.int32), vectors=vectors, group=group)
    verified = node.verifier(held.message, None, now)()
    return node.accept(verified, sender=held.entry.meta.origin, now=now)


def _window_ids(now: float) -> npt.NDArray[np.int64]:
    b = bucket_of(now, BUCKET_S)
    return np.array(sorted({k % VIEW_IDS for k in range(b - WINDOW + 1, b + 1)}))


def _run(tmp_path: Path, *, value: float | None, old_ids: bool = False,
         signer: str = "mallory") -> tuple[list[float], list[Daemon], list[Reason | None]]:
    """ROUNDS rounds of three sensor agents; before each round of agent 0, ``signer`` signs a
    view of ``value`` (None: no attack) into group agent-1. Agent 0's held-out losses and
    what its cache said to each injected view."""
    clock = Clock()
    cfgs = _configs(tmp_path, 3)
    attacker = _attacker(tmp_path) if value is not None else None
    daemons = [Daemon(cfg, clock=clock) for cfg in cfgs]
    ctx = SessionContext(admin_key=daemons[0].cfg.fleet.admin_public_key, now=clock)
    losses: list[float] = []
    verdicts: list[Reason | None] = []
    for r in range(ROUNDS):
        if attacker is not None and value is not None:
            key_state = attacker if signer == "mallory" else cfgs[1].node.state_dir
            ids = _window_ids(clock.t - WINDOW * BUCKET_S) if old_ids else _window_ids(clock.t)
            node = daemons[0].node
            assert isinstance(node, KnowledgeState)
            verdicts.append(_inject(node, key_state, group="agent-1", version=ATTACK_VERSION + r,
                                    now=clock.t, ids=ids, value=value))
        for d in daemons:
            trio.run(d._round)
        losses.append(daemons[0].metrics.val_loss)
        for a in range(3):
            for b in range(a + 1, 3):
                session(daemons[a].node, daemons[b].node, a_ctx=ctx, b_ctx=ctx)
        clock.t += BUCKET_S
    return losses, daemons, verdicts


def _last_finite(losses: list[float]) -> float:
    return [v for v in losses if math.isfinite(v)][-1]


@pytest.mark.parametrize("value", [10.0, 1000.0])
def test_a_member_not_bound_to_an_agent_cannot_speak_for_it(tmp_path: Path,
                                                             value: float) -> None:
    clean, _, _ = _run(tmp_path / "clean", value=None)
    attacked, daemons, verdicts = _run(tmp_path / "attacked", value=value)
    assert verdicts == ["agent_not_bound"] * ROUNDS
    assert _last_finite(attacked) <= 2 * _last_finite(clean)
    node = daemons[0].node
    assert node.rejected["agent_not_bound"] == ROUNDS
    assert isinstance(node, KnowledgeState)
    assert all(agent_of(v.group) != 1 or v.origin == daemons[1].node.id for v in node.views())
    status = daemons[0].status()
    assert status.rejected.get("agent_not_bound") == ROUNDS
    views = status.views
    assert views is not None
    used = {r.agent: r.origin for r in views.peers if r.used}
    assert used == {1: daemons[1].node.id, 2: daemons[2].node.id}


def test_a_view_of_old_buckets_cannot_displace_the_real_agents(tmp_path: Path) -> None:
    _, daemons, verdicts = _run(tmp_path, value=0.5, old_ids=True)
    assert set(verdicts) == {"agent_not_bound"}
    views = daemons[0].status().views
    assert views is not None
    row = next(r for r in views.peers if r.agent == 1)
    assert (row.origin, row.used) == (daemons[1].node.id, True)
    # the real agent 1's view covers the window but the newest bucket, which it has not
    # published yet when agent 0's round took it
    assert row.ids >= WINDOW - 1
    last = _mode(daemons[0]).last
    assert last is not None
    assert last.coverage[1] >= WINDOW - 1


@pytest.mark.parametrize(("value", "reason"), [
    (1000.0, "view_too_large"),  # refused by its size before the round
    (10.0, "view_raises_loss"),  # within the size bound: the round's guard catches it
])
def test_the_bound_agent_itself_cannot_blow_up_a_peer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, value: float, reason: str
) -> None:
    clean, _, _ = _run(tmp_path / "clean", value=None)
    with caplog.at_level("WARNING"):
        attacked, daemons, verdicts = _run(tmp_path / "attacked", value=value,
                                           signer="agent-1")
    assert set(verdicts) == {None}  # bound: held, then refused at use
    assert daemons[0].node.rejected[reason] == ROUNDS
    assert f"({reason})" in caplog.text
    assert _last_finite(attacked) <= 2 * _last_finite(clean)
