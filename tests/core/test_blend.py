"""The blend x = Σ α_j x_j as one matrix product (§3.6.2 worked numbers)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.alpha import AlphaError
from peerd.core.blend import ModelStack, blend, blend_into, blend_rows
from peerd.core.entry import Schema, flatten


def model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "fc.weight": torch.randn(4, 3, generator=g),
        "fc.bias": torch.randn(4, generator=g),
        "bn.running_mean": torch.randn(4, generator=g),
        "bn.num_batches_tracked": torch.tensor(seed, dtype=torch.int64),
    }


def test_seed_blend_0_6_c1_plus_0_3_c2_plus_0_1_c3() -> None:
    c1, c2, c3 = model(1), model(2), model(3)
    out = blend([c1, c2, c3], [0.6, 0.3, 0.1])
    for name in ("fc.weight", "fc.bias", "bn.running_mean"):
        expected = 0.6 * c1[name] + 0.3 * c2[name] + 0.1 * c3[name]
        torch.testing.assert_close(out[name], expected, rtol=1e-6, atol=1e-6)
    # integer buffers are not averaged: they come from the first (own) model
    assert out["bn.num_batches_tracked"].item() == 1


def test_coordinate_by_coordinate_on_tiny_vectors() -> None:
    ms = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 1.0])},
          {"w": torch.tensor([10.0, 10.0])}]
    out = blend(ms, [0.6, 0.3, 0.1])
    torch.testing.assert_close(out["w"], torch.tensor([1.6, 1.3]))


def test_float16_parameters_are_blended_and_cast_back() -> None:
    ms = [{"w": torch.tensor([1.0, 2.0], dtype=torch.float16)},
          {"w": torch.tensor([3.0, 4.0], dtype=torch.float16)}]
    out = blend(ms, [0.5, 0.5])
    assert out["w"].dtype == torch.float16
    assert out["w"].tolist() == [2.0, 3.0]


def test_batched_alpha_blends_many_at_once() -> None:
    matrix = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    alpha = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.25, 0.5]], dtype=torch.float64)
    out = blend_rows(matrix, alpha)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0], [1.25, 1.25]]))


@pytest.mark.parametrize(
    "alpha", [[0.5, 0.6], [1.5, -0.5], [float("nan"), 1.0], [1.0], [0.2, 0.2]]
)
def test_invalid_alpha_is_refused(alpha: list[float]) -> None:
    with pytest.raises(AlphaError):
        blend_rows(torch.zeros(2, 3), alpha)


def test_models_of_different_schemas_cannot_be_blended() -> None:
    with pytest.raises(ValueError, match="different schemas"):
        blend([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}], [0.5, 0.5])


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 10**6),
       raw=st.lists(st.floats(0.01, 100), min_size=6, max_size=6))
def test_blending_identical_models_returns_that_model(n: int, seed: int, raw: list[float]) -> None:
    m = model(seed)
    w = torch.tensor(raw[:n], dtype=torch.float64)
    out = blend([m] * n, w / w.sum())
    for name in ("fc.weight", "fc.bias", "bn.running_mean"):
        torch.testing.assert_close(out[name], m[name], rtol=1e-5, atol=1e-6)


def test_model_stack_keeps_rows_compact_and_blends_by_key() -> None:
    ms = {k: model(i) for i, k in enumerate(["own", "A", "B"])}
    schema = Schema.of(ms["own"])
    stack = ModelStack(schema, rows=3)
    for k, m in ms.items():
        stack.put(k, m)
    stack.remove("own")  # last row moves into the hole
    assert set(stack.keys) == {"A", "B"}
    assert len(stack) == 2
    torch.testing.assert_close(stack.row("B"), flatten(ms["B"], schema))
    out = stack.blend({"A": 0.25, "B": 0.75})
    expected = 0.25 * flatten(ms["A"], schema) + 0.75 * flatten(ms["B"], schema)
    torch.testing.assert_close(out, expected)
    with pytest.raises(KeyError):
        stack.blend({"own": 1.0})
    stack.put("C", ms["own"])
    with pytest.raises(ValueError, match="full"):
        stack.put("D", ms["own"])
    stack.retain(["C"])
    assert stack.keys == ("C",)


# --- blend_into: the daemon's in-place, block-by-block blend -----------------------------


def test_blend_into_matches_the_worked_blend_0_6_0_3_0_1() -> None:
    c1, c2, c3 = model(1), model(2), model(3)
    dest = {k: torch.zeros_like(v) for k, v in c1.items()}
    blend_into(dest, [c1, c2, c3], [0.6, 0.3, 0.1], block=5)  # blocks split every tensor
    expected = blend([c1, c2, c3], [0.6, 0.3, 0.1])
    for name in ("fc.weight", "fc.bias", "bn.running_mean"):
        torch.testing.assert_close(dest[name], expected[name], rtol=1e-6, atol=1e-6)
    # Counters are not averaged: dest keeps its own.
    assert int(dest["bn.num_batches_tracked"]) == 0


def test_blend_into_own_model_that_is_also_an_input() -> None:
    own, other = model(1), model(2)
    before = {k: v.clone() for k, v in own.items()}
    blend_into(own, [own, other], [0.25, 0.75], block=3)
    expected = 0.25 * before["fc.weight"] + 0.75 * other["fc.weight"]
    torch.testing.assert_close(own["fc.weight"], expected, rtol=1e-6, atol=1e-6)


def test_blend_into_non_contiguous_and_bfloat16_destinations() -> None:
    a = {"w": torch.arange(6.0).reshape(2, 3), "h": torch.ones(4, dtype=torch.bfloat16)}
    b = {"w": torch.zeros(2, 3), "h": torch.full((4,), 3.0, dtype=torch.bfloat16)}
    dest = {"w": torch.zeros(3, 2).t(), "h": torch.zeros(4, dtype=torch.bfloat16)}
    assert not dest["w"].is_contiguous()
    blend_into(dest, [a, b], [0.5, 0.5], block=4)
    torch.testing.assert_close(dest["w"], a["w"] / 2)
    assert dest["h"].tolist() == [2.0] * 4


def test_blend_into_refuses_bad_alpha_and_schemas_and_writes_nothing() -> None:
    c1, c2 = model(1), model(2)
    dest = {k: v.clone() for k, v in c1.items()}
    with pytest.raises(AlphaError):
        blend_into(dest, [c1, c2], [0.7, 0.7])
    with pytest.raises(AlphaError):
        blend_into(dest, [c1, c2], [float("nan"), 1.0])
    with pytest.raises(ValueError, match="schema"):
        blend_into(dest, [c1, {**c2, "fc.bias": torch.zeros(5)}], [0.5, 0.5])
    for k in c1:
        assert torch.equal(dest[k], c1[k])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 64), st.integers(0, 2**31))
def test_blend_into_equals_blend_for_any_block_size(n: int, width: int, block: int,
                                                    seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ms = [{"a": torch.randn(width, generator=g), "b": torch.randn(3, width, generator=g)}
          for _ in range(n)]
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.01
    w = w / w.sum()
    dest = {k: torch.empty_like(v) for k, v in ms[0].items()}
    blend_into(dest, ms, w, block=block)
    expected = blend(ms, w)
    for k in dest:
        torch.testing.assert_close(dest[k], expected[k], rtol=1e-5, atol=1e-6)
