"""Sample keys: one projection per fleet, unit float32 keys, cosine roughly preserved."""

from __future__ import annotations

import numpy as np
import pytest

from peerd.learn.keys import SampleEncoder, knn_quality, normalise_inputs, projection_seed


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 1, 28, 28)).astype(np.float32)


def test_every_node_of_a_fleet_computes_the_same_keys() -> None:
    x = _images(5)
    a = SampleEncoder(b"fleet-a", (1, 28, 28)).encode(x)
    b = SampleEncoder(b"fleet-a", (1, 28, 28)).encode(x)
    assert a.dtype == np.float32
    assert a.shape == (5, 64)
    assert np.array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)


def test_fleets_key_dims_and_shapes_get_different_projections() -> None:
    x = _images(3)
    a = SampleEncoder(b"fleet-a", (1, 28, 28)).encode(x)
    b = SampleEncoder(b"fleet-b", (1, 28, 28)).encode(x)
    assert not np.allclose(a, b)
    assert projection_seed(b"f", (784,), 64) != projection_seed(b"f", (1, 28, 28), 64)
    assert projection_seed(b"f", (784,), 64) != projection_seed(b"f", (784,), 32)


def test_brightness_and_contrast_do_not_change_a_key() -> None:
    enc = SampleEncoder(b"f", (1, 28, 28), 32)
    x = _images(4)
    np.testing.assert_allclose(enc.encode(3.0 * x + 7.0), enc.encode(x), atol=1e-5)


def test_a_constant_image_gets_the_zero_key() -> None:
    keys = SampleEncoder(b"f", (2, 2)).encode(np.full((1, 2, 2), 5.0))
    assert not keys.any()


def test_cosine_similarity_survives_the_projection() -> None:
    # Johnson-Lindenstrauss: with 256 dimensions the error is ~1/16 per pair.
    rng = np.random.default_rng(1)
    base = rng.normal(size=(1, 784))
    x = base + rng.normal(size=(200, 784)) * rng.uniform(0.2, 3.0, size=(200, 1))
    enc = SampleEncoder(b"f", (784,), 256)
    raw = normalise_inputs(x.astype(np.float32))
    keys = enc.encode(x)
    raw_cos = (raw @ raw.T)[np.triu_indices(200, 1)]
    key_cos = (keys @ keys.T)[np.triu_indices(200, 1)]
    assert np.mean(np.abs(raw_cos - key_cos)) < 0.08
    assert np.corrcoef(raw_cos, key_cos)[0, 1] > 0.9


@pytest.mark.parametrize(
    ("shape", "x", "message"),
    [
        ((4,), np.zeros((2, 5)), "encoder built for"),
        ((2,), np.array([[1.0, np.nan]]), "NaN"),
        ((2,), np.array([["a", "b"]]), "numeric"),
    ],
)
def test_bad_inputs_are_refused(shape: tuple[int, ...], x: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SampleEncoder(b"f", shape).encode(x)


def test_bad_encoders_are_refused() -> None:
    with pytest.raises(ValueError, match="fleet_id"):
        SampleEncoder(b"", (4,))
    with pytest.raises(ValueError, match="key_dim"):
        SampleEncoder(b"f", (4,), 0)
    with pytest.raises(ValueError, match="input shape"):
        SampleEncoder(b"f", (0,))


def test_knn_quality_counts_label_agreement_and_votes() -> None:
    ref = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], dtype=np.float32)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    labels = np.array([0, 0, 1, 1])
    q = np.array([[1, 0.05], [0.05, 1]], dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    out = knn_quality(ref, labels, q, np.array([0, 0]), k=2)
    # Query 0's two neighbours are label 0, query 1's are label 1 (wrong).
    assert out == {"label_agreement": 0.5, "knn_accuracy": 0.5}
