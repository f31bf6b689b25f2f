"""Pairwise-10 composite MNIST (cordial-learning paper §6.2, §6.2.1): isolated vs cordial agents.

Owns the composites (a sample is N MNIST digits side by side; pairs (1,2), (3,4), … and
(2,4), (4,6), … sum to 10, so the tuples are (a, 10−a, 10−a, a, a, 10−a, …), a ∈ 1..9;
each set holds P composites of every tuple, built from disjoint pools of P images per digit:
training and validation pools from MNIST's training images, the test pool from its test
images, pixels scaled to [−1, 1]), the paper's LeNet-5-style agent (conv 6-16-120, fc 84,
fc 10 = the embedded output h_i, then z_i = W_i h_i + b_i + Σ_j Λ_j^i h_j + c_i and fc4; the
coordination layer starts at zero, the received h_j are constants) and the training:
Adam, batches of 65, ε_e = ε₀/(1+e/t₀)^0.6, the coordination layers frozen for K epochs then
η_e = η₀/(1+(e−K)/t₀), the network with the lowest validation loss (every 5 epochs) kept and
reported on the test set without dropout. Hyperparameters: the paper's Table 1 for P = 25.

All agents of all seeds train as one stacked network (grouped convolutions, batched
matrices): Adam and dropout act elementwise, so this is exactly independent training, faster.
Each seed uses its own draw of the image pools. Randomness: ``torch.Generator`` per method.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as fn

from peerd.learn.data import load_dataset

BATCH, EVAL_EVERY = 65, 5
#: (configuration label, epochs done) -> None.
Progress = Callable[[str, int], None]


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
            raise ValueError(f"--images-per-digit {per_digit}: MNIST has too few {digit}s")
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


def load_images() -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """MNIST from the project's loader, rescaled from its standardisation to [−1, 1]."""
    ds = load_dataset("mnist")
    lo, hi = float(ds.x_train.min()), float(ds.x_train.max())

    def scale(x: torch.Tensor) -> torch.Tensor:
        return ((x[:, 0] - lo) / (hi - lo) * 2.0 - 1.0).clamp(-1.0, 1.0)

    return ({"train": scale(ds.x_train), "test": scale(ds.x_test)},
            {"train": ds.y_train.numpy(), "test": ds.y_test.numpy()})


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

    def forward(self, x: torch.Tensor, messages: bool = True) -> torch.Tensor:
        b, g = x.shape[0], x.shape[1]
        d = self._drop
        h = d(fn.relu(fn.conv2d(x, self.c1w, self.c1b, padding=2, groups=g)))
        h = d(fn.max_pool2d(h, 2))
        h = d(fn.relu(fn.conv2d(h, self.c2w, self.c2b, groups=g)))
        h = d(fn.max_pool2d(h, 2))
        h = d(fn.relu(fn.conv2d(h, self.c3w, self.c3b, groups=g))).reshape(b, g, 120)
        h = d(fn.relu(torch.einsum("bgi,goi->bgo", h, self.f1w) + self.f1b))
        emb = fn.relu(torch.einsum("bgi,goi->bgo", h, self.f2w) + self.f2b)  # h_i
        z = torch.einsum("bgi,goi->bgo", emb, self.f3w) + self.f3b
        if self.cordial and messages:
            # Σ_{j≠i} Λ_j^i h_j + c_i with the received h_j constants (Algorithm 1).
            mask = 1.0 - torch.eye(self.n)
            lam = self.lam * mask[None, :, :, None, None]
            recv = emb.detach().reshape(b, self.seeds, self.n, 10)
            msg = torch.einsum("sijac,bsjc->bsia", lam, recv).reshape(b, g, 10)
            z = z + msg + self.cbias
        return torch.einsum("bgi,goi->bgo", fn.relu(z), self.f4w) + self.f4b


def _gather(draw_x: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """Inputs [B, S·N, 28, 28] for per-seed composite rows [S, B]."""
    parts = [dx[r] for dx, r in zip(draw_x, rows, strict=True)]  # each [B, N, 28, 28]
    return torch.cat(parts, 1)


def _evaluate(model: StackedAgents, draws: list[Draw], split: str, messages: bool = True
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per seed: test loss per agent (Σ_i mean CE_i / N) and accuracy averaged over agents."""
    model.eval()
    with torch.no_grad():
        x = torch.cat([dr.x[split] for dr in draws], 1)
        y = torch.cat([dr.y[split] for dr in draws], 1)
        logits = model(x, messages)
        ce = fn.cross_entropy(logits.permute(0, 2, 1), y, reduction="none")  # [B, G]
        acc = (logits.argmax(-1) == y).double()
    s, n = model.seeds, model.n
    loss = ce.mean(0).reshape(s, n).mean(1).double().numpy()
    return loss, acc.mean(0).reshape(s, n).mean(1).numpy()


def train_method(method: str, n: int, draws: list[Draw], epochs: int, seed: int,
                 hyper: Hyper, progress: Progress | None = None) -> dict[str, Any]:
    """Train one method on every draw at once; the best-validation network of each seed."""
    s = len(draws)
    gen = torch.Generator().manual_seed(seed * 7919 + n * 13 + (method == "cordial"))
    model = StackedAgents(s, n, hyper.dropout, method == "cordial", gen)
    opt = torch.optim.Adam(model.embedding(), lr=hyper.eps0)
    coord: torch.optim.Optimizer | None = None
    rows = draws[0].x["train"].shape[0]
    best_val = np.full(s, np.inf)
    best = {k: np.full(s, np.nan) for k in ("loss", "acc", "acc_removed", "epoch")}
    y_train = [dr.y["train"] for dr in draws]
    for epoch in range(epochs):
        for group in opt.param_groups:
            group["lr"] = hyper.eps0 / (1.0 + epoch / hyper.t0) ** 0.6
        if model.cordial and epoch >= hyper.k:
            if coord is None:
                coord = torch.optim.Adam(model.coordination(), lr=hyper.eta0)
            for group in coord.param_groups:
                group["lr"] = hyper.eta0 / (1.0 + (epoch - hyper.k) / hyper.t0)
        model.train()
        perms = torch.stack([torch.randperm(rows, generator=gen) for _ in range(s)])
        for start in range(0, rows, BATCH):
            idx = perms[:, start:start + BATCH]
            x = _gather([dr.x["train"] for dr in draws], idx)
            y = torch.cat([yt[i] for yt, i in zip(y_train, idx, strict=True)], 1)
            logits = model(x)
            # Σ over agents (and seeds) of each agent's mean cross-entropy.
            loss = fn.cross_entropy(logits.permute(0, 2, 1), y, reduction="none").mean(0).sum()
            opt.zero_grad(set_to_none=True)
            if coord is not None:
                coord.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            if coord is not None:
                coord.step()
        due = (epoch + 1) % EVAL_EVERY == 0 or epoch + 1 == epochs
        # Cordial networks are kept from epoch K on (the paper); a run shorter than K keeps
        # its last evaluation rather than none.
        if due and (not model.cordial or epoch + 1 >= min(hyper.k, epochs)):
            val, _ = _evaluate(model, draws, "val")
            better = val < best_val
            if better.any():
                test_loss, test_acc = _evaluate(model, draws, "test")
                _, removed = _evaluate(model, draws, "test", messages=False)
                best_val = np.where(better, val, best_val)
                for key, v in (("loss", test_loss), ("acc", test_acc), ("acc_removed", removed),
                               ("epoch", np.full(s, epoch + 1.0))):
                    best[key] = np.where(better, v, best[key])
        if progress is not None:
            progress(f"N={n} {method}", 1)
    return {"test_loss": best["loss"].tolist(), "test_accuracy": best["acc"].tolist(),
            "test_accuracy_messages_removed": (best["acc_removed"].tolist()
                                               if method == "cordial" else None),
            "best_epoch": best["epoch"].tolist(), "validation_loss": best_val.tolist()}


#: The paper's Table 2 (P = 25): median test loss per agent and accuracy, 30 runs each.
PAPER_P25 = {2: {"isolated": (0.454, 0.883), "cordial": (0.232, 0.944)},
             4: {"isolated": (0.295, 0.913), "cordial": (0.014, 0.996)},
             6: {"isolated": (0.296, 0.911), "cordial": (0.0028, 1.000)}}


def run_pairwise10(agents: tuple[int, ...], images_per_digit: int, epochs: int, seeds: int,
                   seed: int, methods: tuple[str, ...], progress: Progress | None = None
                   ) -> dict[str, Any]:
    """Every N and method; seed k of a method trains on draw ``seed + k`` of the images."""
    images, labels = load_images()
    hyper = TABLE1_P25
    configs = []
    for n in agents:
        draws = [make_draw(n, images_per_digit, seed + k, images, labels) for k in range(seeds)]
        for method in methods:
            started = time.monotonic()
            res = train_method(method, n, draws, epochs, seed, hyper[method], progress)
            row: dict[str, Any] = {"n": n, "method": method, "runs": seeds,
                                   "median_test_loss": float(np.median(res["test_loss"])),
                                   "median_test_accuracy": float(np.median(
                                       res["test_accuracy"])), **res}
            if res["test_accuracy_messages_removed"] is not None:
                row["median_accuracy_messages_removed"] = float(
                    np.median(res["test_accuracy_messages_removed"]))
            paper = PAPER_P25.get(n, {}).get(method) if images_per_digit == 25 else None
            row["paper_median_test_loss"] = paper[0] if paper else None
            row["paper_median_test_accuracy"] = paper[1] if paper else None
            row["wall_s"] = round(time.monotonic() - started, 1)
            configs.append(row)
    return {"experiment": "pairwise10",
            "settings": {"images_per_digit": images_per_digit, "epochs": epochs,
                         "seeds": seeds, "seed": seed, "agents": list(agents), "batch": BATCH,
                         "eval_every": EVAL_EVERY,
                         "hyperparameters": {k: asdict(v) for k, v in hyper.items()}},
            "configs": configs}


def write_pairwise_outputs(summary: dict[str, Any], out: Path, *, plots: bool = True
                           ) -> list[Path]:
    """``cordial-pairwise10.csv``: one row per run (N, method, seed)."""
    path = out / "cordial-pairwise10.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n", "method", "seed", "test_loss", "test_accuracy",
                    "accuracy_messages_removed", "best_epoch"])
        for row in summary["configs"]:
            removed = row["test_accuracy_messages_removed"] or [None] * row["runs"]
            for k in range(row["runs"]):
                w.writerow([row["n"], row["method"], k, f"{row['test_loss'][k]:.6g}",
                            f"{row['test_accuracy'][k]:.6g}",
                            "" if removed[k] is None else f"{removed[k]:.6g}",
                            int(row["best_epoch"][k])])
    del plots  # a per-run table is the output; the paper's Figure 5 is not redrawn
    return [path]
