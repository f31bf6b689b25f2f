"""flowerapp: a Flower / PyTorch app (the quickstart's task.py, over the 8x8 digits)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the quickstart's spelling)
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset

#: Held out from every partition: the ServerApp's centralized test set.
CENTRAL_TEST = 297


class Net(nn.Module):
    """Model (a small CNN for 1x8x8 images)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 2 * 2)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class Digits(Dataset[dict[str, torch.Tensor]]):
    """Batches as the quickstart's: {"img": ..., "label": ...}."""

    def __init__(self, images: np.ndarray[Any, Any], labels: np.ndarray[Any, Any]) -> None:
        self.images = torch.from_numpy(images).float().div(16.0).view(-1, 1, 8, 8)
        self.labels = torch.from_numpy(labels).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"img": self.images[i], "label": self.labels[i]}


def _shuffled() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    # One fixed order on every node, so that partitions are disjoint without coordination.
    digits = load_digits()
    order = np.random.default_rng(42).permutation(len(digits.target))
    return digits.data[order], digits.target[order]


def load_data(
    partition_id: int, num_partitions: int, batch_size: int
) -> tuple[DataLoader[dict[str, torch.Tensor]], DataLoader[dict[str, torch.Tensor]]]:
    """Load an IID partition of the digits: 80 % train, 20 % test."""
    images, labels = _shuffled()
    images, labels = images[CENTRAL_TEST:], labels[CENTRAL_TEST:]
    part = np.array_split(np.arange(len(labels)), num_partitions)[partition_id]
    cut = int(0.8 * len(part))
    train_idx, test_idx = part[:cut], part[cut:]
    trainloader = DataLoader(
        Digits(images[train_idx], labels[train_idx]), batch_size=batch_size, shuffle=True
    )
    testloader = DataLoader(Digits(images[test_idx], labels[test_idx]), batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset() -> DataLoader[dict[str, torch.Tensor]]:
    """Load the held-out test set."""
    images, labels = _shuffled()
    return DataLoader(Digits(images[:CENTRAL_TEST], labels[:CENTRAL_TEST]), batch_size=128)


def train(
    net: nn.Module,
    trainloader: DataLoader[dict[str, torch.Tensor]],
    epochs: int,
    lr: float,
    device: torch.device,
    proximal_mu: float = 0.0,
) -> float:
    """Train the model on the training set (with FedProx's proximal term when mu > 0)."""
    net.to(device)
    global_params = [p.detach().clone() for p in net.parameters()]
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            if proximal_mu > 0:
                proximal_term = sum(
                    (local - glob).pow(2).sum()
                    for local, glob in zip(net.parameters(), global_params, strict=True)
                )
                loss = loss + (proximal_mu / 2) * proximal_term
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(
    net: nn.Module, testloader: DataLoader[dict[str, torch.Tensor]], device: torch.device
) -> tuple[float, float]:
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += int((torch.max(outputs.data, 1)[1] == labels).sum().item())
    accuracy = correct / len(testloader.dataset)  # type: ignore[arg-type]
    return loss / len(testloader), accuracy
