"""FedCache's three client sizes: parameter counts near the paper's 76k / 171k / 266k."""

from __future__ import annotations

import pytest
import torch

from peerd.learn.models import build_model, count_parameters


@pytest.mark.parametrize(("name", "params", "paper"),
                         [("small", 76_330, 76_200), ("medium", 170_218, 171_200),
                          ("large", 263_306, 266_100)])
def test_sizes_match_the_paper(name: str, params: int, paper: int) -> None:
    model = build_model(name, (1, 28, 28), 10, seed=0)
    assert count_parameters(model) == params
    assert abs(params - paper) / paper < 0.02
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_sized_models_are_seeded_and_differ_in_depth() -> None:
    a = build_model("medium", (64,), 10, seed=3)
    b = build_model("medium", (64,), 10, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    depth = [sum(isinstance(m, torch.nn.Linear) for m in build_model(k, (64,), 10, seed=0)
                 .modules()) for k in ("small", "medium", "large")]
    assert depth == [2, 3, 4]
