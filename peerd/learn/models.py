"""Model architectures shared by the simulator and the daemon's tasks.

All are plain ``nn.Module``s without batch-norm or dropout: the simulator trains many
copies at once through ``torch.func`` and stateless modules keep that exact (no running
statistics to stack, no random masks that would differ between the batched and per-agent
paths). Nothing here loads weights or trains; :func:`build_model` seeds the init and
leaves torch's global RNG state as it found it.
"""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("cnn", "mlp", "linear", "small", "medium", "large")
#: FedCache's three client sizes (its ResNet-small/-medium/-large: 76.2k / 171.2k / 266.1k
#: parameters on 28x28 inputs), here as ReLU MLPs of one, two and three hidden layers with the
#: same parameter budgets: 76,330 / 170,218 / 263,306 on 784 inputs and 10 classes. MLPs, not
#: the paper's small ResNets: the simulator trains 300 of them per round on 2 CPU cores, and a
#: 28x28x16 convolution costs ~20x the MACs of a dense layer of the same parameter count.
SIZED_MODELS: dict[str, tuple[int, ...]] = {
    "small": (96,),
    "medium": (192, 96),
    "large": (256, 192, 64),
}


class PaperCNN(nn.Module):
    """The Cached-DFL paper's MNIST/FashionMNIST CNN: two 5x5 convs and two dense layers.

    conv(1->32, 5x5) -> ReLU -> maxpool 2 -> conv(32->64, 5x5) -> ReLU -> maxpool 2
    -> fc(64*4*4 -> 512) -> ReLU -> fc(512 -> classes). Without padding a 28x28 input
    shrinks 28 -> 24 -> 12 -> 8 -> 4, so fc1 sees 1024 features. With 10 classes that is
    832 + 51,264 + 524,800 + 5,130 = 582,026 parameters (the issue's "~580k").
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(-3)))
        return self.fc2(x)  # type: ignore[no-any-return]


class MLP(nn.Module):
    """One hidden ReLU layer; ``hidden=0`` gives a linear (logistic-regression) model."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        if hidden > 0:
            self.net: nn.Module = nn.Sequential(
                nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
            )
        else:
            self.net = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [B, *features] -> [B, prod(features)]: images work too (``--model mlp`` on MNIST).
        return self.net(x.flatten(1))  # type: ignore[no-any-return]


class DeepMLP(nn.Module):
    """ReLU MLP with the given hidden widths (FedCache's heterogeneous client models)."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))  # type: ignore[no-any-return]


def default_model_kind(dataset: str) -> str:
    """The issue's pairing: the paper's CNN for image sets, an MLP for digits, linear else."""
    if dataset in ("mnist", "fashion-mnist"):
        return "cnn"
    if dataset == "digits":
        return "mlp"
    return "linear"


def build_model(
    kind: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int
) -> nn.Module:
    """Build a freshly initialised model; the same seed gives the same weights."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # nn init draws from the global generator; restore it after
    try:
        if kind == "cnn":
            if tuple(input_shape[-2:]) != (28, 28):
                raise ValueError(f"the paper's CNN needs 28x28 images, got {input_shape}")
            return PaperCNN(num_classes, in_channels=input_shape[0])
        features = 1
        for d in input_shape:
            features *= d
        if kind == "mlp":
            return MLP(features, num_classes, hidden=64)
        if kind == "linear":
            return MLP(features, num_classes, hidden=0)
        if kind in SIZED_MODELS:
            return DeepMLP(features, num_classes, SIZED_MODELS[kind])
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    finally:
        torch.random.set_rng_state(gen_state)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
