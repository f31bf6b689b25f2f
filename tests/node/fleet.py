"""A throw-away fleet for tests: admin key, members, a signed manifest, node states."""

from __future__ import annotations

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.entry import Schema
from peerd.core.validate import ValidationLimits
from peerd.node.state import NodeState
from peerd.protocol.identity import private_key_from_seed, public_key_bytes
from peerd.protocol.manifest import Manifest

FLEET = bytes(range(16))
NOW = 1_800_000_000.0


def key(n: int) -> Ed25519PrivateKey:
    return private_key_from_seed(bytes([n]) * 32)


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"fc.weight": torch.randn(4, 3, generator=g) * 0.1, "fc.bias": torch.zeros(4)}


SCHEMA = Schema.of(model())


def manifest(*members: Ed25519PrivateKey, seq: int = 1) -> Manifest:
    m = Manifest(FLEET, 0)
    for k in members:
        m = m.admit(public_key_bytes(k), None)
    return Manifest(FLEET, seq, m.members, m.revoked)


def node(k: Ed25519PrivateKey, man: Manifest, *, capacity: int = 5, tau_max: float = 600.0,
         limits: ValidationLimits | None = None) -> NodeState:
    return NodeState(key=k, fleet_id=FLEET, manifest=man, schema=SCHEMA,
                     limits=limits or ValidationLimits(), tau_max=tau_max, capacity=capacity)
