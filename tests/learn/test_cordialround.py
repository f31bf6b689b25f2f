"""The daemon's cordial round: the shared index aligns the agents' digits, absent views are
zero inputs, the coordination layers start at zero and stay frozen through the warm-up, and
an agent fed an informative peer view learns what it cannot alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peerd.learn.cordialround import (
    WIDTH,
    CordialAgent,
    CordialLearner,
    PeerView,
    agent_data,
    index_size,
)
from peerd.learn.pairwise10 import load_images


@pytest.fixture(scope="module")
def images() -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    return load_images()


def test_the_shared_index_aligns_the_agents(images: tuple[dict[str, torch.Tensor], dict[
        str, np.ndarray]]) -> None:
    a0, a1, a2 = (agent_data(4, i, 3, seed=7, images=images) for i in range(3))
    assert a0.size == index_size(3) == 81
    assert a0.ids["train"].tolist() == list(range(27))
    assert a0.ids["test"].tolist() == list(range(54, 81))
    for split in ("train", "val", "test"):
        assert (a0.y[split] + a1.y[split] == 10).all()  # pair (0, 1) sums to 10 on every id
        assert (a1.y[split] == a2.y[split]).all()  # (2, 4)-style cross pairs: equal digits
        assert not torch.equal(a0.x[split], a1.x[split])  # each keeps only its own digit
    again = agent_data(4, 0, 3, seed=7, images=images)
    assert torch.equal(again.x["train"], a0.x["train"])
    other = agent_data(4, 0, 3, seed=8, images=images)
    assert not torch.equal(other.x["train"], a0.x["train"])
    with pytest.raises(ValueError, match="even"):
        agent_data(3, 0, 3, seed=7, images=images)
    with pytest.raises(ValueError, match="index"):
        agent_data(4, 4, 3, seed=7, images=images)


def test_zero_coordination_and_absent_views_change_nothing() -> None:
    agent = CordialAgent(4, 1, 0.0, torch.Generator().manual_seed(0))
    agent.eval()
    x = torch.randn(5, 28, 28)
    emb = agent.embed(x)
    alone = agent.logits(emb, None)
    recv = torch.randn(5, 4, WIDTH)
    torch.testing.assert_close(agent.logits(emb, recv), alone)  # Λ = 0 at the start
    with torch.no_grad():
        agent.lam.fill_(0.5)
    own_only = torch.zeros(5, 4, WIDTH)
    own_only[:, 1] = 100.0  # the agent's own slot is masked: its h_i is not a message
    torch.testing.assert_close(agent.logits(emb, own_only), alone)
    assert not torch.allclose(agent.logits(emb, recv), alone)


def test_received_table_and_coverage(images: tuple[dict[str, torch.Tensor], dict[
        str, np.ndarray]]) -> None:
    learner = CordialLearner(agent_data(4, 0, 3, seed=1, images=images), steps=1)
    v = np.ones((3, WIDTH), np.float32)
    table, coverage = learner.received([
        PeerView(2, np.array([0, 5, 80]), v),
        PeerView(2, np.array([1]), v[:1] * 7),  # a staler view of agent 2: ignored
        PeerView(0, np.array([1]), v[:1]),  # claims to be us: ignored
        PeerView(3, np.array([4, 81, 99]), v),  # ids beyond the index: not counted
        PeerView(9, np.array([4]), v[:1]),  # no such agent
    ])
    assert coverage == {2: 3, 3: 1}
    assert table.shape == (81, 4, WIDTH)
    assert float(table[:, 2].sum()) == 3 * WIDTH
    assert float(table[:, 3].sum()) == WIDTH
    assert float(table[:, 0].abs().sum()) == 0.0
    assert float(table[:, 1].abs().sum()) == 0.0  # agent 1 sent nothing: zero inputs


def test_coordination_is_frozen_through_the_warmup(images: tuple[dict[str, torch.Tensor],
                                                                 dict[str, np.ndarray]]) -> None:
    data = agent_data(2, 0, 3, seed=1, images=images)  # 27 training rows
    learner = CordialLearner(data, warmup_epochs=2, batch_size=9, steps=3, seed=1)
    peer = PeerView(1, np.arange(data.size), np.random.default_rng(0).random(
        (data.size, WIDTH)).astype(np.float32))
    out = learner.round([peer])
    assert out.epoch == 1.0
    assert float(learner.model.lam.detach().abs().sum()) == 0.0
    assert out.views.shape == (81, WIDTH)
    assert out.coverage == {1: 81}
    learner.round([peer])
    learner.round([peer])  # epochs 2-3: the coordination layers move
    assert float(learner.model.lam[1].detach().abs().sum()) > 0.0
    assert float(learner.model.lam[0].detach().abs().sum()) == 0.0  # own slot: no gradient
    isolated = CordialLearner(data, coordination=False, warmup_epochs=0, batch_size=9, steps=3)
    for _ in range(3):
        isolated.round([peer])
    assert float(isolated.model.lam.detach().abs().sum()) == 0.0


def test_an_informative_view_is_learned_from(images: tuple[dict[str, torch.Tensor], dict[
        str, np.ndarray]]) -> None:
    # The peer's "view" is its digit, one-hot (what a perfect peer embedding could carry):
    # with it agent 0's label is 10 − that digit. The cordial agent's test accuracy ends
    # above the same agent's trained alone on the same steps.
    data = agent_data(2, 0, 5, seed=3, images=images)
    peer_digits = 10 - torch.cat([data.y[s] for s in ("train", "val", "test")])
    onehot = torch.nn.functional.one_hot(peer_digits, WIDTH).float().numpy()
    view = PeerView(1, np.arange(data.size), onehot)
    acc = {}
    for coordination in (True, False):
        learner = CordialLearner(data, coordination=coordination, warmup_epochs=0,
                                 batch_size=15, steps=30, seed=0)
        for _ in range(4):
            out = learner.round([view])
        acc[coordination] = out.test_accuracy
    assert acc[True] >= acc[False] + 0.2
