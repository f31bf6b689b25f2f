"""`peerd sim fedcvt`: FedCVT against vanilla vertical FL on a two-party vertical split.

Seed ``fedbss-fedcvt-lecture.txt`` §16.6 and the FedCVT paper (Kang et al., 2022). Two
parties hold different feature blocks of the same people:

- **mnist**: party A the left 14 pixel columns of each image, party B the right 14;
- **breast_cancer**: party A the means and standard errors (columns 0–19), party B the
  "worst" values (columns 20–29), scikit-learn's own three feature groups.

A seeded fraction ``aligned`` of the training people is seen by both parties and labelled (A
holds the labels). The rest is split in two halves: people only A has (A still holds their
labels: the paper's setting, where the label party's non-aligned rows are labelled) and
people only B has (no label anywhere: these are the rows the pseudo-label gate serves). The
test set is the dataset's held-out test split with both views (an aligned test set).

Both methods train the same models from the same seed for the same number of steps on the
same aligned batches: an encoder per party (MLP → a ``dim``-vector representation) and a
classifier on both representations, f^AB. FedCVT adds f^A and f^B (one view each) and, per
step (the lecture's "learn, fill, label, train, repeat", §16.6.4):

1. represent the aligned batch (both views), an A-only batch and a B-only batch;
2. fill the missing view by attention (:func:`peerd.core.fedcvt.attention_fill`): the query
   and keys are the *present* view's representations (this person, the aligned batch), the
   values the other party's representations of the aligned batch — the paper's "unique"
   estimator (``fedcvt_repr_estimator.py``);
3. label: A-only rows have their true labels; B-only rows get a pseudo label only where the
   gate (:func:`peerd.core.fedcvt.pseudo_label_gate`: all three agree, each > threshold)
   accepts, after ``warmup_steps`` steps (our choice: random classifiers on two classes pass a
   > 0.5 gate trivially, since a two-class maximum is always ≥ 0.5);
4. train on the sum of the cross-view losses: A, B and AB on aligned rows; A and AB on A-only
   rows; B and AB on gated B-only rows (a classifier is trained only where its input holds a
   real view, our choice — the paper trains all three on the expanded set).

Simplifications against the paper, said here once: one representation per party (the paper
splits it into shared and unique halves, adds a shared-space attention estimate, and
regularises the halves with similarity and difference losses); no soft labels estimated by
the same attention (the paper's code has them). Prediction is f^AB's (the federated
classifier), evaluated on the aligned test set. Two ablations: ``pseudo_labels=False`` (B-only
rows unused) and, with it, ``fill=False`` (A-only rows train E^A and f^A only).

Owns the data split, the models and the two training loops; the attention and the gate are
:mod:`peerd.core.fedcvt`'s. Randomness comes from one ``torch.Generator`` per run.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812  (the torch convention)

from peerd.core.fedcvt import attention_fill, cross_view_loss, pseudo_label_gate

DATASETS = ("breast_cancer", "mnist")


@dataclass(frozen=True)
class FedCVTConfig:
    """One run's settings; :meth:`validate` says what is wrong in one sentence."""

    dataset: str = "breast_cancer"
    aligned: float = 0.1
    seed: int = 0
    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-3
    hidden: int = 64
    dim: int = 16
    threshold: float = 0.5
    #: Attention sharpening temperature; 0 (the default): off, the seed's softmax(QKᵀ/√d_k),
    #: whose 1/√d_k scale is there to keep the weights soft. The paper's code sharpens with
    #: 0.1, which raises the weights to the 10th power and undoes that scale (issue 28).
    sharpen: float = 0.0
    warmup_steps: int = 50
    #: Use only this many training people (0: all of them); keeps MNIST runs short.
    train_samples: int = 0
    #: False: the ablation without the gate (B-only rows unused; fill + A-only rows stay).
    pseudo_labels: bool = True
    #: False: the ablation without the attention fill (A-only rows train E^A and f^A only).
    fill: bool = True

    def validate(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got "
                             f"{self.dataset!r}")
        if not (0.0 < self.aligned < 1.0):
            raise ValueError(f"--aligned fractions must be in (0, 1), got {self.aligned}")
        for name in ("steps", "batch_size", "hidden", "dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got "
                                 f"{getattr(self, name)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if not (0.0 <= self.threshold < 1.0):
            raise ValueError(f"--threshold must be in [0, 1), got {self.threshold}")
        if not (math.isfinite(self.sharpen) and self.sharpen >= 0):
            raise ValueError(f"--sharpen must be >= 0 (0: off), got {self.sharpen}")
        if self.warmup_steps < 0 or self.train_samples < 0:
            raise ValueError("--warmup-steps and --train-samples must be >= 0")
        if self.pseudo_labels and not self.fill:
            raise ValueError("--no-fill needs --no-pseudo-labels (the gate reads filled views)")


@dataclass(frozen=True)
class Views:
    """Both parties' feature blocks, train and test, and the labels."""

    a_train: torch.Tensor
    b_train: torch.Tensor
    y_train: torch.Tensor
    a_test: torch.Tensor
    b_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int


def load_views(dataset: str) -> Views:
    """The two-party vertical split of ``dataset`` (module docstring)."""
    from peerd.learn.data import load_dataset

    d = load_dataset(dataset)
    if dataset == "mnist":
        def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (x[..., :14].reshape(len(x), -1).contiguous(),
                    x[..., 14:].reshape(len(x), -1).contiguous())
    else:
        def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x[:, :20].contiguous(), x[:, 20:].contiguous()
    a_tr, b_tr = split(d.x_train)
    a_te, b_te = split(d.x_test)
    return Views(a_tr, b_tr, d.y_train, a_te, b_te, d.y_test, d.num_classes)


@dataclass(frozen=True)
class Split:
    """Indices into the training people: aligned, A-only (labelled), B-only (unlabelled)."""

    aligned: np.ndarray
    a_only: np.ndarray
    b_only: np.ndarray


def split_people(n: int, config: FedCVTConfig) -> Split:
    """Seeded: a permutation, the first ``aligned`` fraction both views, the rest halved."""
    perm = np.random.default_rng(config.seed).permutation(n)
    if config.train_samples:
        perm = perm[: config.train_samples]
    n_al = round(config.aligned * len(perm))
    if n_al < 2:
        raise ValueError(f"--aligned {config.aligned} leaves {n_al} aligned people of "
                         f"{len(perm)}; attention needs at least 2")
    rest = perm[n_al:]
    half = len(rest) // 2
    return Split(perm[:n_al], rest[:half], rest[half:])


def _mlp(n_in: int, hidden: int, n_out: int, gen: torch.Generator) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))
    _init(net, gen)
    return net


def _init(module: nn.Module, gen: torch.Generator) -> None:
    """PyTorch's default Linear init (U(±1/√fan_in)), drawn from the run's generator."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            bound = 1.0 / math.sqrt(layer.in_features)
            with torch.no_grad():
                layer.weight.uniform_(-bound, bound, generator=gen)
                layer.bias.uniform_(-bound, bound, generator=gen)


class Models(nn.Module):
    """Encoders E^A, E^B and classifiers f^A, f^B, f^AB (vanilla VFL uses f^AB only)."""

    def __init__(self, n_a: int, n_b: int, classes: int, config: FedCVTConfig,
                 gen: torch.Generator) -> None:
        super().__init__()
        self.enc_a = _mlp(n_a, config.hidden, config.dim, gen)
        self.enc_b = _mlp(n_b, config.hidden, config.dim, gen)
        self.f_ab = nn.Linear(2 * config.dim, classes)
        self.f_a = nn.Linear(config.dim, classes)
        self.f_b = nn.Linear(config.dim, classes)
        for layer in (self.f_ab, self.f_a, self.f_b):
            _init(layer, gen)

    def joint(self, ha: torch.Tensor, hb: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.f_ab(torch.cat([ha, hb], dim=1))
        return out


@dataclass
class Counters:
    """Pseudo-label bookkeeping over the run (B-only rows seen after warm-up)."""

    offered: int = 0
    accepted: int = 0
    correct: int = 0


def _batch(n: int, size: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(n, (min(size, n),), generator=gen)


def _fedcvt_loss(m: Models, v: Views, s: Split, step: int, config: FedCVTConfig,
                 gen: torch.Generator, counters: Counters) -> torch.Tensor:
    sharpen = config.sharpen or None
    al = torch.from_numpy(s.aligned)[_batch(len(s.aligned), config.batch_size, gen)]
    ha, hb = m.enc_a(v.a_train[al]), m.enc_b(v.b_train[al])
    y = v.y_train[al]
    loss = cross_view_loss((m.f_a(ha), m.f_b(hb), m.joint(ha, hb)), y)
    if len(s.a_only):
        ia = torch.from_numpy(s.a_only)[_batch(len(s.a_only), config.batch_size, gen)]
        hau = m.enc_a(v.a_train[ia])
        if config.fill:
            hb_hat = attention_fill(hau, ha, hb, sharpen=sharpen)
            loss = loss + cross_view_loss((m.f_a(hau), m.joint(hau, hb_hat)), v.y_train[ia])
        else:
            loss = loss + cross_view_loss((m.f_a(hau),), v.y_train[ia])
    if config.pseudo_labels and len(s.b_only) and step >= config.warmup_steps:
        ib = torch.from_numpy(s.b_only)[_batch(len(s.b_only), config.batch_size, gen)]
        hbu = m.enc_b(v.b_train[ib])
        ha_hat = attention_fill(hbu, hb, ha, sharpen=sharpen)
        with torch.no_grad():
            gate = pseudo_label_gate(F.softmax(m.f_a(ha_hat), dim=1),
                                     F.softmax(m.f_b(hbu), dim=1),
                                     F.softmax(m.joint(ha_hat, hbu), dim=1),
                                     threshold=config.threshold)
        ok = gate.accepted
        counters.offered += len(ib)
        counters.accepted += int(ok.sum())
        counters.correct += int((gate.labels[ok] == v.y_train[ib][ok]).sum())
        loss = loss + cross_view_loss((m.f_b(hbu[ok]), m.joint(ha_hat[ok], hbu[ok])),
                                      gate.labels[ok])
    return loss


def _vanilla_loss(m: Models, v: Views, s: Split, config: FedCVTConfig,
                  gen: torch.Generator) -> torch.Tensor:
    al = torch.from_numpy(s.aligned)[_batch(len(s.aligned), config.batch_size, gen)]
    logits = m.joint(m.enc_a(v.a_train[al]), m.enc_b(v.b_train[al]))
    return F.cross_entropy(logits, v.y_train[al])


def _accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(dim=1) == y).float().mean())


def run_one(v: Views, config: FedCVTConfig, method: str) -> dict[str, float | int | None]:
    """Train one method (``fedcvt`` or ``vanilla``) and score it on the aligned test set."""
    s = split_people(len(v.y_train), config)
    gen = torch.Generator().manual_seed(config.seed)
    m = Models(v.a_train.shape[1], v.b_train.shape[1], v.num_classes, config, gen)
    opt = torch.optim.Adam(m.parameters(), lr=config.lr)
    counters = Counters()
    # The same batch generator for both methods: the aligned batches come first in each step.
    batches = torch.Generator().manual_seed(config.seed + 1)
    for step in range(config.steps):
        if method == "fedcvt":
            loss = _fedcvt_loss(m, v, s, step, config, batches, counters)
        else:
            loss = _vanilla_loss(m, v, s, config, batches)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    with torch.no_grad():
        ha, hb = m.enc_a(v.a_test), m.enc_b(v.b_test)
        out: dict[str, float | int | None] = {
            "accuracy": _accuracy(m.joint(ha, hb), v.y_test),
            "n_aligned": len(s.aligned), "n_a_only": len(s.a_only), "n_b_only": len(s.b_only),
        }
        if method == "fedcvt":
            out["view_a_accuracy"] = _accuracy(m.f_a(ha), v.y_test)
            out["view_b_accuracy"] = _accuracy(m.f_b(hb), v.y_test)
            out["pseudo_accepted_fraction"] = (counters.accepted / counters.offered
                                               if counters.offered else None)
            out["pseudo_label_precision"] = (counters.correct / counters.accepted
                                             if counters.accepted else None)
    return out


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for a single run)."""
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


Progress = Callable[[str], None]


def run_grid(base: FedCVTConfig, aligned: Sequence[float], seeds: Sequence[int],
             progress: Progress | None = None) -> dict[str, object]:
    """Every (fraction, seed) pair, both methods; the summary that ``--json`` prints."""
    for a in aligned:
        FedCVTConfig(**{**asdict(base), "aligned": a}).validate()
    base.validate()
    if not seeds:
        raise ValueError("--seeds needs at least one seed")
    started = time.monotonic()
    views = load_views(base.dataset)
    runs: list[dict[str, object]] = []
    table: list[dict[str, object]] = []
    for a in aligned:
        acc: dict[str, list[float]] = {"vanilla": [], "fedcvt": []}
        for seed in seeds:
            config = FedCVTConfig(**{**asdict(base), "aligned": a, "seed": seed})
            for method in ("vanilla", "fedcvt"):
                t0 = time.monotonic()
                res = run_one(views, config, method)
                res["seconds"] = round(time.monotonic() - t0, 2)
                acc[method].append(float(res["accuracy"] or 0.0))
                runs.append({"aligned": a, "seed": seed, "method": method, **res})
                if progress is not None:
                    progress(f"aligned {a} seed {seed} {method}: accuracy "
                             f"{res['accuracy']:.4f} ({res['seconds']} s)")
        (vm, vs), (fm, fs) = _mean_std(acc["vanilla"]), _mean_std(acc["fedcvt"])
        gains = [f - v for f, v in zip(acc["fedcvt"], acc["vanilla"], strict=True)]
        table.append({"aligned": a, "vanilla_mean": vm, "vanilla_std": vs, "fedcvt_mean": fm,
                      "fedcvt_std": fs, "gain_mean": statistics.fmean(gains),
                      "fedcvt_wins": sum(g > 0 for g in gains), "seeds": len(seeds)})
    config_out = {k: val for k, val in asdict(base).items() if k not in ("aligned", "seed")}
    return {"method": "fedcvt", "config": config_out, "aligned": list(aligned),
            "seeds": list(seeds), "table": table, "runs": runs,
            "wall_seconds": round(time.monotonic() - started, 1)}
