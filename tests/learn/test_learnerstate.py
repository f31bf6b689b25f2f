"""A local learner saved and restored: knowledge mode's model and cordial mode's agent (its
network, both Adam optimisers, step count, random stream and the epoch's remaining rows)
come back bit for bit, a restored cordial agent's next round equals the uninterrupted one,
and a learner another config builds, or a state that does not fit, leaves it fresh."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from peerd.core.distill import Distillation, distill_local_update
from peerd.learn import learnerstate
from peerd.learn.cordialround import WIDTH, AgentData, CordialLearner, PeerView, agent_data
from peerd.learn.learnerstate import KnowledgeLearner
from peerd.learn.models import build_model
from peerd.learn.pairwise10 import load_images
from peerd.store import learnerfile
from peerd.store.learnerfile import LEARNER_BLOB
from peerd.store.statedir import StateDir

Images = tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]


@pytest.fixture(scope="module")
def images() -> Images:
    return load_images()


def _data(images: Images, index: int = 1, agents: int = 4) -> AgentData:
    return agent_data(agents, index, 3, seed=5, images=images)


def _learner(data: AgentData, coordination: bool = True) -> CordialLearner:
    # Warm-up of one epoch (27 rows, 8 per step): round 2 already trains Λ.
    return CordialLearner(data, coordination=coordination, warmup_epochs=1, batch_size=8,
                          steps=3, seed=5)


def _views(data: AgentData) -> list[PeerView]:
    rng = np.random.default_rng(0)
    return [PeerView(j, np.arange(data.size), rng.random((data.size, WIDTH), dtype=np.float32))
            for j in range(data.agents) if j != data.index]


def _same_state(a: CordialLearner, b: CordialLearner) -> None:
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(),
                                 strict=True):
        assert torch.equal(x, y), name
    for oa, ob in ((a.opt, b.opt), (a.coord, b.coord)):
        assert (oa is None) == (ob is None)
        if oa is None or ob is None:
            continue
        sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
        assert sorted(sa) == sorted(sb)
        for i in sa:
            for key in learnerstate.ADAM_KEYS:
                assert sa[i][key].dtype == sb[i][key].dtype
                assert torch.equal(sa[i][key], sb[i][key]), (i, key)
    assert torch.equal(a.gen.get_state(), b.gen.get_state())
    assert torch.equal(a._order, b._order)
    assert a.done_steps == b.done_steps


@pytest.mark.parametrize("rounds", [1, 3])  # before the warm-up ends, and after it
def test_a_restored_cordial_agent_continues_exactly(tmp_path: Path, images: Images,
                                                    rounds: int) -> None:
    data = _data(images)
    views = _views(data)
    a = _learner(data)
    for _ in range(rounds):
        a.round(views)
    assert (a.coord is not None) == (rounds == 3)
    state = StateDir(tmp_path / "st")
    assert learnerstate.save(state, a, rounds)
    b = _learner(data)
    assert learnerstate.restore(state, b) == rounds
    _same_state(a, b)
    assert not any(x.data_ptr() == y.data_ptr()  # copies, not the file's bytes
                   for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True))
    for _ in range(2):
        out_a, out_b = a.round(views), b.round(views)
        assert np.array_equal(out_a.views, out_b.views)
        assert (out_a.train_loss, out_a.test_accuracy) == (out_b.train_loss,
                                                           out_b.test_accuracy)
    _same_state(a, b)
    fresh = _learner(data)
    assert not np.array_equal(fresh.round(views).views, out_a.views)  # state mattered


def test_another_agent_or_fleet_shape_is_ignored_with_the_reason(
    tmp_path: Path, images: Images, caplog: pytest.LogCaptureFixture
) -> None:
    data = _data(images)
    a = _learner(data)
    a.round(_views(data))
    state = StateDir(tmp_path / "st")
    assert learnerstate.save(state, a, 1)
    cases = [
        (_learner(_data(images, index=2)), "agent 1 (now 2)"),
        (_learner(_data(images, agents=6)), "agents 4 (now 6)"),
        (_learner(data, coordination=False), "coordination 1 (now 0)"),
    ]
    for other, reason in cases:
        before = copy.deepcopy(other.model.state_dict())
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert learnerstate.restore(state, other) is None
        assert reason in caplog.text
        assert other.done_steps == 0
        for k, v in before.items():
            assert torch.equal(other.model.state_dict()[k], v), k
    assert state.blob_path(LEARNER_BLOB).exists()


def test_a_cordial_state_with_values_it_cannot_have_leaves_it_fresh(
    tmp_path: Path, images: Images, caplog: pytest.LogCaptureFixture
) -> None:
    data = _data(images)
    a = _learner(data)
    a.round(_views(data))
    good = a.snapshot(1)
    state = StateDir(tmp_path / "st")
    bad_order = dict(good.tensors, order=np.full_like(good.tensors["order"], 10_000))
    bad_counts = {**good.counts, "coord": 2}
    for tensors, counts, reason in [
        (bad_order, good.counts, "shuffled rows outside [0, 27)"),
        (good.tensors, bad_counts, "do not fit this learner"),
    ]:
        assert learnerfile.save(state, learnerfile.LearnerState(
            good.mode, good.identity, 1, counts, tensors, good.bfloat16))
        b = _learner(data)
        before = copy.deepcopy(b.model.state_dict())
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert learnerstate.restore(state, b) is None
        assert reason in caplog.text
        for k, v in before.items():
            assert torch.equal(b.model.state_dict()[k], v), k
        assert (b.done_steps, len(b._order), b.coord) == (0, 0, None)


def _knowledge_model(kind: str = "small") -> nn.Module:
    return build_model(kind, (1, 8, 8), 10, seed=3)


def _train(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    X, y = torch.randn(40, 1, 8, 8, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    distill_local_update(model, X, y, torch.zeros(40, 10), torch.zeros(40, dtype=torch.int64),
                         steps=4, batch_size=8, lr=0.1, policy=Distillation(beta=0.0),
                         generator=torch.Generator().manual_seed(seed))


def test_a_knowledge_model_round_trips_and_trains_on_identically(tmp_path: Path) -> None:
    model = _knowledge_model()
    _train(model, 1)
    state = StateDir(tmp_path / "st")
    assert learnerstate.save(state, KnowledgeLearner(model, task="digits", model_name="small"),
                             1)
    restored = _knowledge_model()
    assert learnerstate.restore(
        state, KnowledgeLearner(restored, task="digits", model_name="small")) == 1
    for k, v in model.state_dict().items():
        assert torch.equal(restored.state_dict()[k], v), k
    _train(model, 2)
    _train(restored, 2)
    for k, v in model.state_dict().items():
        assert torch.equal(restored.state_dict()[k], v), k


def test_a_bfloat16_model_round_trips(tmp_path: Path) -> None:
    model = _knowledge_model().to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.25)
    state = StateDir(tmp_path / "st")
    assert learnerstate.save(state, KnowledgeLearner(model, task="t", model_name=None), 4)
    other = _knowledge_model().to(torch.bfloat16)
    assert learnerstate.restore(state, KnowledgeLearner(other, task="t", model_name=None)) == 4
    for k, v in model.state_dict().items():
        assert other.state_dict()[k].dtype == torch.bfloat16
        assert torch.equal(other.state_dict()[k], v), k


def test_a_knowledge_model_of_other_shapes_is_ignored_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateDir(tmp_path / "st")
    assert learnerstate.save(state, KnowledgeLearner(_knowledge_model("small"), task="t",
                                                     model_name="custom"), 2)
    # The same name, another architecture (e.g. a user's module changed): shapes decide.
    other = _knowledge_model("medium")
    before = copy.deepcopy(other.state_dict())
    with caplog.at_level("WARNING"):
        assert learnerstate.restore(state, KnowledgeLearner(other, task="t",
                                                            model_name="custom")) is None
    assert "its tensors differ from this config's learner" in caplog.text
    for k, v in before.items():
        assert torch.equal(other.state_dict()[k], v), k
