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
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as fn

from peerd.learn.pairwise10 import TABLE1_P25, Draw, Hyper, StackedAgents, load_images, make_draw

__all__ = ["TABLE1_P25", "Draw", "Hyper", "StackedAgents", "load_images", "make_draw",
           "run_pairwise10", "train_method", "write_pairwise_outputs"]

BATCH, EVAL_EVERY = 65, 5
#: (configuration label, epochs done) -> None.
Progress = Callable[[str, int], None]


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
