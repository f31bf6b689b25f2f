"""The knowledge cache: eq. 17 by hand, exclusion, replacement, expiry, validation and the
HNSW path against exact search."""

from __future__ import annotations

import numpy as np
import pytest

from peerd.learn import knowcache
from peerd.learn.knowcache import KnowledgeBatch, KnowledgeCache


def batch(origin: str, keys: list[list[float]] | np.ndarray, labels: list[int] | np.ndarray,
          logits: list[list[float]] | np.ndarray, version: int = 1) -> KnowledgeBatch:
    return KnowledgeBatch(origin, version, 0.0, np.asarray(keys, dtype=np.float32),
                          np.asarray(labels), np.asarray(logits, dtype=np.float32))


def small_cache() -> KnowledgeCache:
    cache = KnowledgeCache(key_dim=2, num_classes=3)
    # Label 0 keys around (1, 0); label 1 around (0, 1).
    cache.put(batch("a", [[1, 0], [0, 1]], [0, 1], [[1, 0, 0], [0, 1, 0]]))
    cache.put(batch("b", [[1, 0.1], [1, 1]], [0, 0], [[3, 0, 0], [0, 0, 9]]))
    cache.put(batch("me", [[1, 0.01]], [0], [[100, 100, 100]]))
    return cache


def test_teacher_is_the_mean_of_the_r_nearest_same_label_keys_of_other_origins() -> None:
    cache = small_cache()
    z, n = cache.teacher_logits(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]),
                                np.array([0, 1, 2]), r=2, exclude="me")
    # Sample 0 (label 0): nearest label-0 keys of others: a's (1,0) and b's (1,0.1); me's own
    # (1, 0.01) is excluded, b's (1, 1) is third. Mean of [1,0,0] and [3,0,0].
    np.testing.assert_allclose(z[0], [2, 0, 0])
    # Sample 1 (label 1): only a's (0, 1) exists: one neighbour.
    np.testing.assert_allclose(z[1], [0, 1, 0])
    # Sample 2 (label 2): nobody holds label 2: zeros, count 0.
    np.testing.assert_allclose(z[2], [0, 0, 0])
    assert n.tolist() == [2, 1, 0]
    assert z.dtype == np.float32
    assert n.dtype == np.int64


def test_r_larger_than_the_label_averages_what_exists() -> None:
    z, n = small_cache().teacher_logits(np.array([[1.0, 0.0]]), np.array([0]), r=16,
                                        exclude="me")
    np.testing.assert_allclose(z[0], [4 / 3, 0, 3])  # a, b, b's far key: (1+3+0, 0, 9)/3
    assert n.tolist() == [3]


def test_an_origin_not_in_the_cache_excludes_nothing() -> None:
    z, n = small_cache().teacher_logits(np.array([[1.0, 0.0]]), np.array([0]), r=1,
                                        exclude="stranger")
    np.testing.assert_allclose(z[0], [1, 0, 0])  # a's key equals the query
    assert n.tolist() == [1]


def test_put_replaces_an_origins_batch_and_drop_removes_it() -> None:
    cache = small_cache()
    assert cache.origins() == ("a", "b", "me")
    assert len(cache) == 5
    cache.put(batch("b", [[0.2, 1]], [1], [[0, 5, 0]], version=2))
    assert len(cache) == 4
    assert cache.version_of("b") == 2
    z, n = cache.teacher_logits(np.array([[0.0, 1.0]]), np.array([1]), r=4, exclude="me")
    np.testing.assert_allclose(z[0], [0, 3, 0])  # a's [0,1,0] and b's new [0,5,0]
    cache.drop("a")
    cache.drop("never-held")
    z, n = cache.teacher_logits(np.array([[0.0, 1.0]]), np.array([1]), r=4, exclude="me")
    np.testing.assert_allclose(z[0], [0, 5, 0])
    assert cache.origins() == ("b", "me")
    assert n.tolist() == [1]


def test_new_logits_for_the_same_keys_rebuild_no_index() -> None:
    cache = small_cache()
    q = np.array([[1.0, 0.0]])
    cache.teacher_logits(q, np.array([0]), r=1, exclude="me")
    built = cache.rebuilds
    cache.put(batch("a", [[1, 0], [0, 1]], [0, 1], [[7, 0, 0], [0, 1, 0]], version=2))
    z, _ = cache.teacher_logits(q, np.array([0]), r=1, exclude="me")
    np.testing.assert_allclose(z[0], [7, 0, 0])  # the new logits, from the memoised set
    assert cache.rebuilds == built
    cache.put(batch("a", [[1, 0], [0, 1]], [0, 0], [[7, 0, 0], [0, 1, 0]], version=3))
    cache.teacher_logits(q, np.array([0]), r=1, exclude="me")
    assert cache.rebuilds > built  # a label changed: that label's index was rebuilt


def test_the_cache_keeps_its_own_copy_of_a_batch() -> None:
    keys = np.array([[1.0, 0.0]], dtype=np.float32)
    logits = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    cache = KnowledgeCache(2, 3)
    cache.put(KnowledgeBatch("a", 1, 0.0, keys, np.array([0]), logits))
    logits[:] = 99.0
    keys[:] = [0.0, 1.0]
    z, _ = cache.teacher_logits(np.array([[1.0, 0.0]]), np.array([0]), r=1, exclude="me")
    np.testing.assert_allclose(z[0], [1, 2, 3])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: batch("", [[1, 0]], [0], [[0, 0, 0]]), "origin"),
        (lambda: batch("a", [[1, 0, 0]], [0], [[0, 0, 0]]), "keys must be"),
        (lambda: batch("a", [[1, 0]], [0], [[0, 0]]), "logits must be"),
        (lambda: batch("a", [[1, 0]], [3], [[0, 0, 0]]), "labels outside"),
        (lambda: batch("a", [[1, 0]], [-1], [[0, 0, 0]]), "labels outside"),
        (lambda: batch("a", [[1, 0]], [0], [[0, np.nan, 0]]), "NaN"),
        (lambda: batch("a", [[np.inf, 0]], [0], [[0, 0, 0]]), "NaN"),
        (lambda: batch("a", [[0, 0]], [0], [[0, 0, 0]]), "zero"),
        (lambda: batch("a", np.zeros((0, 2)), [], np.zeros((0, 3))), "n >= 1"),
        (lambda: KnowledgeBatch("a", -1, 0.0, np.ones((1, 2)), np.zeros(1, np.int64),
                                np.zeros((1, 3))), "version"),
        (lambda: KnowledgeBatch("a", 1, float("nan"), np.ones((1, 2)), np.zeros(1, np.int64),
                                np.zeros((1, 3))), "created_at"),
        (lambda: KnowledgeBatch("a", 1, 0.0, np.ones((1, 2)), np.zeros(1),
                                np.zeros((1, 3))), "integers"),
    ],
)
def test_bad_batches_are_refused_and_leave_the_cache_unchanged(make: object,
                                                               message: str) -> None:
    cache = small_cache()
    assert callable(make)
    with pytest.raises(ValueError, match=message):
        cache.put(make())
    assert cache.origins() == ("a", "b", "me")
    assert len(cache) == 5


def test_bad_queries_are_refused() -> None:
    cache = small_cache()
    with pytest.raises(ValueError, match="do not match"):
        cache.teacher_logits(np.zeros((2, 2)), np.array([0]), r=1, exclude="me")
    with pytest.raises(ValueError, match="labels must be"):
        cache.teacher_logits(np.ones((1, 2)), np.array([5]), r=1, exclude="me")
    with pytest.raises(ValueError, match="r must be"):
        cache.teacher_logits(np.ones((1, 2)), np.array([0]), r=0, exclude="me")


def test_hnsw_finds_nearly_the_exact_neighbours() -> None:
    # One label with more keys than HNSW_MIN goes through faiss's HNSW graph.
    rng = np.random.default_rng(0)
    d, per, origins = 16, 700, 4
    n = per * origins
    assert n >= knowcache.HNSW_MIN
    keys = rng.normal(size=(n, d)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    logits = np.zeros((n, 3), dtype=np.float32)
    logits[:, 0] = np.arange(n)  # each sample's logit names it
    cache = KnowledgeCache(d, 3)
    for o in range(origins):
        sl = slice(o * per, (o + 1) * per)
        cache.put(KnowledgeBatch(f"o{o}", 1, 0.0, keys[sl], np.zeros(per, np.int64),
                                 logits[sl]))
    queries = rng.normal(size=(50, d)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    z, count = cache.teacher_logits(queries, np.zeros(50, np.int64), r=1, exclude="o0")
    assert count.tolist() == [1] * 50
    others = keys[per:]
    exact = per + np.argmax(queries @ others.T, axis=1)
    recall = np.mean(z[:, 0].astype(np.int64) == exact)
    assert recall >= 0.95
    assert (z[:, 0] >= per).all()  # never o0's own samples
