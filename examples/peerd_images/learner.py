"""A python learner as a PyTorch project would write it: a ``Dataset`` over image files on
disk, a small CNN, AdamW with a cosine schedule, augmentation, mixed precision on a GPU.

peerd's side is two lines of config (docs/learners.md)::

    [learner]
    kind = "python"
    entry = "peerd_images.learner:make_learner"   # called once per worker with a LearnerContext
    model = "peerd_images.learner:Net"            # the fleet's initial model, built seeded
    [learner.node_config]
    data-dir = "/var/lib/peerd-images"            # this node's folder (make_images.py writes one)

Everything else is ordinary training code; what peerd adds is :class:`Proximal`, the pull
ρ/2‖x − x̄‖² towards the blended model x̄ (``anchor``) that Cached-DFL's local step needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from peerd.learn.learner.contract import (
    EvalResult,
    FitConfig,
    FitResult,
    LearnerContext,
    Params,
)
from peerd.learn.learner.proximal import Proximal

#: The image size and classes every node's model is built for (fixed: the fleet's schema).
SIZE, CLASSES = 8, 10
#: Bounds on what is read, checked before reading: a runaway folder must not exhaust memory,
#: nor a hostile file decompress into a huge image.
MAX_FILES = 200_000
#: node_config key naming this node's data folder.
DATA_DIR = "data-dir"


class DigitFolder(Dataset[tuple[torch.Tensor, int]]):
    """``root/<label>/*.png``, read lazily (one file per item), optionally augmented."""

    def __init__(self, root: Path, *, augment: bool = False) -> None:
        files = sorted(root.glob("*/*.png"))
        if len(files) > MAX_FILES:
            raise ValueError(f"{root}: more than {MAX_FILES} images")
        self.items = [(f, int(f.parent.name)) for f in files if f.parent.name.isdigit()]
        self.augment = augment
        self._rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with Image.open(path) as img:
            if img.size != (SIZE, SIZE):  # checked on the header, before decoding
                raise ValueError(f"{path}: {img.size}, not {SIZE}x{SIZE}")
            x = torch.from_numpy(np.asarray(img.convert("L"), dtype=np.float32) / 255.0)
        if self.augment:  # a shift of up to one pixel: digits are not always centred
            dy, dx = self._rng.integers(-1, 2, size=2)
            x = torch.roll(x, shifts=(int(dy), int(dx)), dims=(0, 1))
        return x.unsqueeze(0), label


class Net(nn.Module):
    """Two convolutions and two dense layers (about 38,000 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
                                  nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # type: ignore[no-any-return]


def _cycle(loader: DataLoader[tuple[torch.Tensor, int]]) -> Iterator[tuple[torch.Tensor, ...]]:
    while True:
        yield from loader


class ImageLearner:
    """The learner: peerd calls :meth:`fit` and :meth:`evaluate` every round."""

    def __init__(self, ctx: LearnerContext) -> None:
        root = Path(str(ctx.node_config.get(DATA_DIR, "")))
        if not (root / "train").is_dir():
            raise ValueError(f"[learner.node_config] {DATA_DIR} = {str(root)!r} "
                             f"has no train/ folder (make_images.py writes one)")
        self.device = torch.device(ctx.device)
        self.train = DigitFolder(root / "train", augment=True)
        self.val = DigitFolder(root / "val")
        self.lr = float(ctx.run_config.get("lr", 3e-3))
        self.weight_decay = float(ctx.run_config.get("weight-decay", 1e-4))
        self.workers = int(ctx.run_config.get("num-workers", 0))
        self.model = Net().to(self.device)

    def _load(self, params: Params) -> None:
        self.model.load_state_dict(params)

    def fit(self, params: Params, anchor: Params, config: FitConfig) -> FitResult:
        self._load(params)
        model, device = self.model, self.device
        prox = Proximal(model, anchor, config.rho)
        loader = DataLoader(self.train, batch_size=config.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(config.seed),
                            num_workers=self.workers, pin_memory=device.type == "cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(config.steps, 1))
        amp = device.type == "cuda"
        scaler = torch.amp.GradScaler(device.type, enabled=amp)
        model.train()
        losses = []
        batches = _cycle(loader)
        for _ in range(config.steps):
            x, y = (t.to(device, non_blocking=True) for t in next(batches))
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, enabled=amp):
                task_loss = nn.functional.cross_entropy(model(x), y)
            # The proximal term in full precision, outside autocast.
            scaled: torch.Tensor = scaler.scale(task_loss.float() + prox.term())
            scaled.backward()  # type: ignore[no-untyped-call]
            scaler.step(opt)
            scaler.update()
            sched.step()
            losses.append(float(task_loss.detach()))
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        return FitResult(params=state, num_examples=len(self.train),
                         metrics={"train_loss": float(np.mean(losses)) if losses else 0.0,
                                  "lr": float(sched.get_last_lr()[0])})

    @torch.no_grad()
    def evaluate(self, params: Params, config: FitConfig) -> EvalResult:
        self._load(params)
        self.model.eval()
        total, correct, n = 0.0, 0, 0
        for x, y in DataLoader(self.val, batch_size=256, num_workers=self.workers):
            x, y = x.to(self.device), y.to(self.device)
            out = self.model(x)
            total += float(nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            n += len(y)
        if n == 0:
            return EvalResult(loss=0.0, num_examples=0)
        return EvalResult(loss=total / n, num_examples=n, metrics={"accuracy": correct / n})


def make_learner(ctx: LearnerContext) -> ImageLearner:
    """``[learner] entry``: peerd calls it once in each worker process it starts."""
    return ImageLearner(ctx)
