from __future__ import annotations

import pytest
import torch

from peerd.learn.models import MLP, PaperCNN, build_model, count_parameters, default_model_kind


def test_paper_cnn_has_582k_parameters_and_classifies_28x28() -> None:
    cnn = PaperCNN()
    # 832 + 51,264 + 524,800 + 5,130: the "~580k".
    assert count_parameters(cnn) == 582_026
    assert cnn(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_mlp_and_linear() -> None:
    assert count_parameters(MLP(64, 10, hidden=64)) == 64 * 64 + 64 + 64 * 10 + 10
    assert count_parameters(MLP(30, 2, hidden=0)) == 30 * 2 + 2
    assert MLP(64, 10)(torch.zeros(5, 64)).shape == (5, 10)
    image_mlp = build_model("mlp", (1, 28, 28), 10, seed=0)
    assert image_mlp(torch.zeros(5, 1, 28, 28)).shape == (5, 10)


def test_build_model_is_seeded_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("mlp", (64,), 10, seed=7)
    after = torch.rand(1)
    b = build_model("mlp", (64,), 10, seed=7)
    c = build_model("mlp", (64,), 10, seed=8)
    assert torch.equal(before, after)
    pa, pb, pc = (torch.cat([p.reshape(-1) for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)


def test_defaults_and_errors() -> None:
    assert default_model_kind("mnist") == "cnn"
    assert default_model_kind("digits") == "mlp"
    assert default_model_kind("breast_cancer") == "linear"
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", (64,), 10, seed=0)
    with pytest.raises(ValueError, match="28x28"):
        build_model("cnn", (1, 8, 8), 10, seed=0)
