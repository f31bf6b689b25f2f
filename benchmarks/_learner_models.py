"""The model and learners of benchmarks/bench_learner.py, imported by name in the worker.

``resnet18``: torchvision's ResNet-18 layout (7 × 7 stride-2 stem and max-pool, BasicBlock
[2, 2, 2, 2], widths 64…512, batch norm) with 10 classes, built here so that torchvision is
not needed: 11,181,642 parameters (plus batch-norm statistics), the size issue 26 asks about
(an "11M-parameter model"). Fed 3 × 32 × 32 images.

``Bench`` is the worker's learner: with ``run_config["train"]`` it trains its own copy for
the round's K steps (the built-in step rule, on ``config.device``) and reports how long that
took; without, it returns the parameters it is given, so that a round trip is the learner
boundary alone (params to the worker and back, every check included).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from peerd.core.local_update import local_update
from peerd.learn.learner.contract import EvalResult, FitConfig, FitResult, LearnerContext, Params


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.down(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(self.stem(x))
        out: torch.Tensor = self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))
        return out


def resnet18() -> nn.Module:
    return ResNet18()


def images(rows: int, seed: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor,
                                                                              torch.Tensor]:
    """Generated 3 × 32 × 32 images and labels (the same in the daemon and the worker)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (rows,), generator=g)
    return x.to(device), y.to(device)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a GPU's kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Bench:
    """Trains for real (``run_config["train"]``) or hands x̄ straight back."""

    def __init__(self, context: LearnerContext) -> None:
        self.device = torch.device(context.device)
        torch.manual_seed(0)
        self.model = resnet18().to(self.device)

    def fit(self, params: Params, anchor: Params, config: FitConfig) -> FitResult:
        if not config.run_config.get("train"):
            return FitResult(params=params, num_examples=1, metrics={})
        began = time.perf_counter()
        self.model.load_state_dict(params)
        pull = {n: anchor[n].to(self.device) for n, _ in self.model.named_parameters()}
        rows = int(config.run_config["rows"])
        x, y = images(rows, config.seed, self.device)
        result = local_update(self.model, x, y, steps=config.steps,
                              batch_size=config.batch_size, lr=config.lr, rho=config.rho,
                              loss="cross_entropy",
                              generator=torch.Generator().manual_seed(config.seed),
                              anchor=pull)
        sync(self.device)
        return FitResult(params={k: v.detach() for k, v in self.model.state_dict().items()},
                         num_examples=rows,
                         metrics={"train_loss": result.mean_loss,
                                  "fit_s": time.perf_counter() - began})

    def evaluate(self, params: Params, config: FitConfig) -> EvalResult:
        return EvalResult(loss=0.0, num_examples=1, metrics={})
