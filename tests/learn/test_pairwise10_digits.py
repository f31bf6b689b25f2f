"""Pairwise-10 composites of scikit-learn's digits: what a plain install's cordial demo runs.

The digits are drawn into MNIST's layout (a 20x20 box in a 28x28 frame, pixels in [−1, 1]), so
the paper's agent takes them unchanged, and the P the config admits for them is exactly what
their rarest digit allows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peerd.daemon.config_limits import MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT
from peerd.learn.cordialround import CordialAgent, agent_data, index_size
from peerd.learn.data import digits_pixels
from peerd.learn.pairwise10 import load_images, make_draw


def test_digit_images_are_laid_out_as_mnist_is() -> None:
    images, labels = load_images("digits")
    x_tr, y_tr, _, y_te = digits_pixels()
    assert images["train"].shape == (len(y_tr), 28, 28)
    assert images["test"].shape == (len(y_te), 28, 28)
    np.testing.assert_array_equal(labels["train"], y_tr)
    np.testing.assert_array_equal(labels["test"], y_te)
    for x in images.values():
        assert x.dtype == torch.float32
        assert float(x.min()) == -1.0
        assert float(x.max()) <= 1.0
        # The 4-pixel border is background, as MNIST's is; the ink is inside the box.
        border = torch.ones(28, 28, dtype=torch.bool)
        border[4:24, 4:24] = False
        assert bool((x[:, border] == -1.0).all())
        assert float(x[:, 4:24, 4:24].max()) > 0.9
    # The raw pixels run 0..16, the scale the frame divides by.
    assert float(x_tr.max()) == 16.0


def test_the_config_limit_on_p_is_what_the_digits_allow() -> None:
    images = load_images("digits")
    top = MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT
    draw = make_draw(4, top, 0, *images)
    assert {k: tuple(v.shape) for k, v in draw.x.items()} == {
        s: (9 * top, 4, 28, 28) for s in ("train", "val", "test")}
    with pytest.raises(ValueError, match="too few"):
        make_draw(4, top + 1, 0, *images)


def test_an_agent_of_digit_composites_runs_the_papers_network() -> None:
    data = agent_data(2, 1, 25, 0, source="digits")
    assert data.size == index_size(25)
    # Agent 1 of a pair sees 10 − a of (a, 10 − a): digits 1..9, as on MNIST.
    assert set(data.y["train"].tolist()) == set(range(1, 10))
    agent = CordialAgent(2, 1, 0.0, torch.Generator().manual_seed(0))
    assert agent.embed(data.x["test"][:5]).shape == (5, 10)
    # Another seed, another draw: the shared index is the seed's, as with MNIST.
    other = agent_data(2, 1, 25, 1, source="digits")
    assert not torch.equal(data.x["train"], other.x["train"])


def test_unknown_images_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown images 'fashion-mnist'"):
        load_images("fashion-mnist")
