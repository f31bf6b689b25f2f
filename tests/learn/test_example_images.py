"""examples/peerd_images: the python learner a PyTorch project would write (image files on
disk through a Dataset, AdamW + cosine schedule) trains through the learner contract."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import torch

from peerd.learn.learner.contract import FitConfig, Learner, LearnerContext

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(EXAMPLES))  # examples/ is not installed
    write = importlib.import_module("peerd_images.make_images").write
    n_train, n_val = write(tmp_path / "node0", node=0, nodes=2, digits=(0, 1, 2, 3, 4))
    assert n_train > 300  # half of the training rows, five of the ten digits
    assert n_val == 360
    assert len(list((tmp_path / "node0" / "train").glob("*/*.png"))) == n_train
    return tmp_path / "node0"


def test_the_example_learner_trains_from_the_anchor_and_reports_its_data(images: Path) -> None:
    mod = importlib.import_module("peerd_images.learner")
    ctx = LearnerContext(node_id="12D3KooWtest", device="cpu",
                         node_config={"data-dir": str(images)}, run_config={"lr": 0.005})
    learner = mod.make_learner(ctx)
    assert isinstance(learner, Learner)
    torch.manual_seed(0)
    start = {k: v.detach().clone() for k, v in mod.Net().state_dict().items()}
    config = FitConfig(round=1, rho=0.01, steps=60, seed=7, device="cpu", batch_size=32, lr=0.0)
    before = learner.evaluate(start, config)
    fit = learner.fit(start, start, config)
    after = learner.evaluate(fit.params, config)
    assert fit.num_examples == len(list((images / "train").glob("*/*.png")))
    assert set(fit.params) == set(start)
    assert all(fit.params[k].shape == v.shape and fit.params[k].dtype == v.dtype
               for k, v in start.items())
    assert all(torch.isfinite(v).all() for v in fit.params.values())
    assert math.isfinite(fit.metrics["train_loss"])
    assert fit.metrics["lr"] < 0.005  # the cosine schedule ran down over the round's steps
    # It saw digits 0-4 only: about half the validation digits are reachable; chance is 0.1.
    assert before.metrics["accuracy"] < 0.2
    assert after.metrics["accuracy"] > 0.35


def test_a_node_without_its_folder_is_told_which_key(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    mod = importlib.import_module("peerd_images.learner")
    with pytest.raises(ValueError, match="data-dir"):
        mod.make_learner(LearnerContext(node_id="x", device="cpu",
                                        node_config={"data-dir": str(tmp_path / "none")}))
