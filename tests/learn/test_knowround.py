"""The daemon's knowledge round pieces: the model choice, the fleet's knowledge schema, and
one round that distils from a peer's knowledge."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from peerd.core.distill import Distillation
from peerd.core.staleness import Clock
from peerd.learn.knowcache import KnowledgeBatch, KnowledgeCache
from peerd.learn.knowround import (
    KnowledgeRoundInput,
    encode_keys,
    knowledge_schema,
    run_knowledge_round,
    task_model,
)
from peerd.learn.tasks import Task, TaskError, load_task
from peerd.protocol.limits import MAX_LOGIT_ABS


def digits(i: int = 0) -> Task:
    return load_task("digits", partition_spec="iid", node_index=i, node_count=3, seed=0)


def tiny(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user's model factory (``[task] model = "tests.learn.test_knowround:tiny"``)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_models_by_name_and_by_factory() -> None:
    task = digits()
    sizes = [params(task_model(task, name)) for name in ("small", "medium", "large")]
    assert sizes == sorted(sizes)
    assert len(set(sizes)) == 3
    assert params(task_model(task, "tests.learn.test_knowround:tiny")) == 64 * 10 + 10
    assert params(task_model(task, None)) == params(task.model())
    with pytest.raises(TaskError, match="cannot load model"):
        task_model(task, "tests.learn.nowhere:tiny")


def test_the_schema_depends_on_the_data_and_key_width_not_the_architecture() -> None:
    task = digits()
    ids = {knowledge_schema(b"f" * 16, task, task_model(task, m), key_dim=64,
                            max_samples=100)[0].id for m in ("small", "medium", "large")}
    assert len(ids) == 1
    wider = knowledge_schema(b"f" * 16, task, task_model(task, "small"), key_dim=32,
                             max_samples=100)[0]
    assert wider.id not in ids


def test_a_round_distils_from_a_peer_and_publishes_bounded_logits() -> None:
    torch.manual_seed(0)
    task, peer = digits(0), digits(1)
    model = task_model(task, "small")
    data, pdata = task.data(), peer.data()
    schema, encoder = knowledge_schema(b"f" * 16, task, model, key_dim=64,
                                       max_samples=1000)
    keys = encode_keys(encoder, data.X_train)
    batch = KnowledgeBatch("peer", 1, 0.0, encode_keys(encoder, pdata.X_train),
                           pdata.y_train.numpy(),
                           np.eye(10, dtype=np.float32)[pdata.y_train.numpy()] * 5)
    cache = KnowledgeCache(64, schema.num_classes)
    inp = KnowledgeRoundInput(own_id="me", clock=Clock.time(0.0), peers=[batch],
                              policy=Distillation(beta=1.5, r=4), steps=3,
                              batch_size=16, lr=0.05, seed=1)
    out = run_knowledge_round(model, data, keys, cache, inp, publish_rows=50)
    assert out.peers == 1
    assert out.taught == len(data.y_train)  # every local label has peer samples (iid)
    assert out.logits.shape == (50, 10)
    assert np.isfinite(out.logits).all()
    assert np.abs(out.logits).max() <= MAX_LOGIT_ABS
    assert cache.origins() == ("peer",)
    # The peer gone from the round's input: gone from the cache too.
    again = KnowledgeRoundInput(own_id="me", clock=Clock.time(0.0), peers=[],
                                policy=inp.policy, steps=1, batch_size=16, lr=0.05, seed=2)
    assert run_knowledge_round(model, data, keys, cache, again, 10).taught == 0
    assert cache.origins() == ()


def test_eq9_zero_knowledge_pulls_untaught_samples_towards_uniform() -> None:
    # Alone in its first round: "zero" distils every sample towards τ(0) (uniform), "none"
    # trains by cross-entropy only. Same model, data, seed and steps; only the teacher differs.
    task = digits()
    data = task.data()

    def trained(zero: bool) -> tuple[np.ndarray, int]:
        torch.manual_seed(0)
        model = task_model(task, "small")
        schema, encoder = knowledge_schema(b"f" * 16, task, model, key_dim=64,
                                           max_samples=1000)
        inp = KnowledgeRoundInput(own_id="me", clock=Clock.time(0.0), peers=[],
                                  policy=Distillation(beta=1.5, r=4),
                                  steps=30, batch_size=16, lr=0.05, seed=1, zero_untaught=zero)
        out = run_knowledge_round(model, data, encode_keys(encoder, data.X_train),
                                  KnowledgeCache(64, schema.num_classes), inp, publish_rows=200)
        return out.logits, out.taught

    zero, taught_zero = trained(True)
    ce, taught_ce = trained(False)
    assert taught_zero == taught_ce == 0  # zeros are not a peer's knowledge

    def spread(logits: np.ndarray) -> float:
        return float((logits.max(axis=1) - logits.min(axis=1)).mean())

    assert spread(zero) < 0.9 * spread(ce)
