"""A plain loop as an external learner: blend → a few AdamW steps → publish, repeated.

The daemon runs with ``[learner] kind = "external"`` and ``model = "external_loop.model:Net"``
(both must import ``external_loop``: ``PYTHONPATH=examples``); this process is started by
hand, as the daemon's user, and may stop and start again at any time::

    PYTHONPATH=examples python -m external_loop.loop /var/lib/peerd --node 0 --nodes 3

Everything about training is this file's: the data (one share of scikit-learn's digits),
the optimizer (AdamW, kept across rounds), the proximal term ρ/2‖x − x̄‖² towards the blend
(ρ is the daemon's ``[learning] rho``), the device. The daemon keeps the cache, the blend,
the checks, the signature and the gossip.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import peerd.client
from external_loop.model import Net
from peerd.learn.learner.proximal import Proximal


def digits_share(node: int, nodes: int) -> tuple[torch.Tensor, ...]:
    """Node ``node``'s share of the digits: train and validation tensors (IID, seeded)."""
    digits = load_digits()
    order = np.random.default_rng(42).permutation(len(digits.target))
    x = torch.tensor(digits.data[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target[order], dtype=torch.long)
    cut = int(0.8 * len(y))
    mine = torch.arange(cut)[node::nodes]
    return x[mine], y[mine], x[cut:], y[cut:]


def run(state_dir: str, *, rounds: int, node: int = 0, nodes: int = 1, batch: int = 32,
        lr: float = 3e-3, device: str = "cpu", say: Callable[[str], None] = print,
        attach: Callable[[str], AbstractContextManager[Any]] = peerd.client.connect,
        ) -> list[peerd.client.Published]:
    """``rounds`` times: blend, train ``peer.steps`` mini-batches, publish; the receipts.

    ``attach`` opens the daemon connection (``peerd.client.connect``); a test passes a
    stand-in with the same ``blend``/``publish`` to run this very loop without a daemon."""
    x, y, xv, yv = (t.to(device) for t in digits_share(node, nodes))
    model = Net().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(node)
    receipts = []
    with attach(state_dir) as peer:
        for r in range(rounds):
            anchor = peer.blend()  # x̄ as of now: the daemon's blend of its cache
            model.load_state_dict(anchor)
            prox = Proximal(model, anchor, peer.rho)
            model.train()
            for _ in range(peer.steps):
                idx = torch.randint(len(y), (batch,), generator=gen).to(device)
                loss = loss_fn(model(x[idx]), y[idx]) + prox.term()
                opt.zero_grad()
                loss.backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                out = model(xv)
                val_loss = float(loss_fn(out, yv))
                acc = float((out.argmax(1) == yv).float().mean())
            receipt = peer.publish(model.state_dict(), num_examples=len(y),
                                   metrics={"train_loss": loss.item(), "val_loss": val_loss,
                                            "accuracy": acc})
            receipts.append(receipt)
            # How many models the blend held (own + cached peers): 1 until a peer arrives.
            head = f"round {r + 1}: blend of {len(peer.last_alpha)}, val acc {acc:.3f}"
            say(f"{head}, published as version {receipt.version}" if receipt.published
                else f"{head}, not published")
    return receipts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("state_dir", help="the daemon's [node] state_dir (or its learner.sock)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--node", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1,
                   help="the share is every NODES-th training image, from the NODE-th")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    run(a.state_dir, rounds=a.rounds, node=a.node, nodes=a.nodes, device=a.device)


if __name__ == "__main__":
    main()
