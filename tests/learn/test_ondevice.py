"""The built-in learner on ``[learner] device`` (peerd.learn.ondevice): the round trains and
evaluates a copy of the model kept on the device and copies the result back into the CPU
model. Through a CPU copy the round is the plain round bit for bit, with and without peers,
x̄ from the published entry or from the blend, and the batch-norm statistics carried back;
on a GPU (where one exists) it agrees with the CPU to float tolerance."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.entry import CacheItem, Entry
from peerd.core.local_update import LossName
from peerd.core.staleness import Clock
from peerd.learn.ondevice import DeviceCopy
from peerd.learn.tasks import TaskData
from peerd.learn.trainer import RoundInput, RoundOutput, run_round


class BNTask:
    name = "bn"
    loss: LossName = "cross_entropy"

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    def data(self) -> TaskData:
        g = torch.Generator().manual_seed(1)
        X = torch.randn(64, 5, generator=g)
        y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
        return TaskData(X[:48], y[:48], X[48:], y[48:])


def _round(model: nn.Module, on_device: DeviceCopy | None, *, peers: bool) -> RoundOutput:
    task = BNTask()
    published = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cache: tuple[CacheItem, ...] = ()
    entries: list[Entry] = []
    if peers:
        peer = Entry.create(origin="peer", version=1, created_at=90.0, num_examples=20,
                            params={k: v + 0.3 if v.is_floating_point() else v
                                    for k, v in published.items()})
        cache, entries = (CacheItem(peer.meta, "peer", 95.0),), [peer]
    inp = RoundInput(own_id="me", cache=cache, peers=entries, clock=Clock.time(100.0),
                     policy=AlphaPolicy.parse("uniform"), steps=7, batch_size=8, lr=0.2,
                     rho=0.5, seed=3, published=published, model_is_published=not peers,
                     on_device=on_device)
    return run_round(model, task, inp)


@pytest.mark.parametrize("peers", [False, True])
def test_a_round_through_a_cpu_copy_is_the_plain_round_bit_for_bit(peers: bool) -> None:
    plain_model, copied_model = BNTask().model(), BNTask().model()
    plain = _round(plain_model, None, peers=peers)
    dev = DeviceCopy(copied_model, "cpu")
    copied = _round(copied_model, dev, peers=peers)
    assert (copied.train_loss, copied.val_loss, copied.val_accuracy) == (
        plain.train_loss, plain.val_loss, plain.val_accuracy)
    assert copied.alpha == plain.alpha
    assert copied.params.keys() == plain.params.keys()
    for name, t in plain.params.items():
        assert torch.equal(copied.params[name], t), name  # the CPU model got the result
    # The running statistics trained on the copy came back with the weights.
    assert int(copied_model.state_dict()["1.num_batches_tracked"]) == 7
    assert copied.params["0.weight"].data_ptr() == copied_model.state_dict()["0.weight"].data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_round_on_the_gpu_agrees_with_the_cpu() -> None:
    cpu = _round(BNTask().model(), None, peers=True)
    gpu_model = BNTask().model()
    gpu = _round(gpu_model, DeviceCopy(gpu_model, "cuda"), peers=True)
    assert all(t.device.type == "cpu" for t in gpu.params.values())
    for name, t in cpu.params.items():
        torch.testing.assert_close(gpu.params[name], t, rtol=1e-4, atol=1e-5)
    assert gpu.train_loss == pytest.approx(cpu.train_loss, rel=1e-4)
