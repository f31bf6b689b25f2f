"""Manhattan-grid mobility and radio contacts, vectorised over agents with numpy.

The world is a grid of ``blocks_x`` by ``blocks_y`` square blocks of side ``block_length``
metres, i.e. ``(blocks_x + 1) * (blocks_y + 1)`` intersections joined by straight streets.
Each agent drives along the streets at a constant ``speed`` (m/s) and the world advances in
ticks of ``dt`` seconds (1 s by default, as in the paper). On reaching an intersection an
agent goes straight with probability 0.5 (when a straight road exists), otherwise turns onto
one of the other roads uniformly; it makes a U-turn only at a dead end, where no other road
exists (an end of a single street when one of the block counts is 0). Where no straight road
exists (the grid's edge), the agent turns uniformly among the roads that exist.
Deterministic given the ``numpy.random.Generator`` passed in (no global RNG); it knows
nothing of models or training: what a contact exchanges is :mod:`peerd.sim.algorithms`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Directions: +x, +y, -x, -y. Reverse of d is (d + 2) % 4.
DIRS = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=np.int64)


@dataclass(frozen=True)
class GridConfig:
    blocks_x: int = 10
    blocks_y: int = 10
    block_length: float = 300.0
    speed: float = 13.89  # the paper's 50 km/h
    comm_range: float = 100.0
    dt: float = 1.0

    def __post_init__(self) -> None:
        if self.blocks_x < 0 or self.blocks_y < 0 or self.blocks_x + self.blocks_y == 0:
            raise ValueError("the grid needs at least one block edge (blocks_x + blocks_y >= 1)")
        if not (self.block_length > 0 and self.speed > 0 and self.dt > 0):
            raise ValueError("block_length, speed and dt must be positive")
        if self.comm_range < 0:
            raise ValueError("comm_range must be >= 0")


class ManhattanMobility:
    """State of N agents on the grid. Deterministic given the ``numpy`` Generator."""

    def __init__(self, config: GridConfig, num_agents: int, rng: np.random.Generator) -> None:
        self.config = config
        self.rng = rng
        self.n = num_agents
        self.shape = np.array([config.blocks_x, config.blocks_y], dtype=np.int64)
        # Each agent sits on the street from intersection `node` towards `node + DIRS[dir]`,
        # `offset` metres past `node` (0 <= offset < block_length).
        self.node = np.stack(
            [rng.integers(0, s + 1, size=num_agents) for s in self.shape], axis=1
        ).astype(np.int64)
        self.dir = np.zeros(num_agents, dtype=np.int64)
        avail = self._available(self.node)
        for a in range(num_agents):
            self.dir[a] = rng.choice(np.flatnonzero(avail[a]))
        self.offset = rng.uniform(0.0, config.block_length, size=num_agents)
        # Counters of intersection decisions, for tests and sanity checks.
        self.decisions = {"straight": 0, "turn": 0, "uturn": 0, "forced_turn": 0}

    def _available(self, node: np.ndarray) -> np.ndarray:
        """(m, 4) bool: which of the four roads leave each given intersection."""
        nxt = node[:, None, :] + DIRS[None, :, :]
        avail: np.ndarray = np.all((nxt >= 0) & (nxt <= self.shape), axis=2)
        return avail

    def positions(self) -> np.ndarray:
        """(N, 2) float coordinates in metres."""
        return self.node * self.config.block_length + DIRS[self.dir] * self.offset[:, None]

    def step(self) -> None:
        """Advance every agent by one tick."""
        length = self.config.block_length
        self.offset = self.offset + self.config.speed * self.config.dt
        # A fast agent (or a short block) may pass several intersections in one tick.
        while True:
            arrived = np.flatnonzero(self.offset >= length)
            if arrived.size == 0:
                return
            self.offset[arrived] -= length
            self.node[arrived] += DIRS[self.dir[arrived]]
            self.dir[arrived] = self._choose(self.node[arrived], self.dir[arrived])

    def _choose(self, node: np.ndarray, came: np.ndarray) -> np.ndarray:
        m = len(came)
        avail = self._available(node)
        rows = np.arange(m)
        back = (came + 2) % 4
        avail[rows, back] = False  # no U-turn ...
        straight_ok = avail[rows, came]
        turns = avail.copy()
        turns[rows, came] = False
        n_turns = turns.sum(axis=1)
        u = self.rng.random((m, 2))
        go_straight = straight_ok & ((n_turns == 0) | (u[:, 0] < 0.5))
        # k-th available turn, k uniform in [0, n_turns): argmax of cumsum == k + 1.
        k = np.minimum((u[:, 1] * n_turns).astype(np.int64), np.maximum(n_turns - 1, 0))
        turn_dir = np.argmax(np.cumsum(turns, axis=1) == (k + 1)[:, None], axis=1)
        new = np.where(go_straight, came, turn_dir)
        dead_end = ~straight_ok & (n_turns == 0)
        new = np.where(dead_end, back, new)  # ... except at a dead end
        self.decisions["straight"] += int(go_straight.sum())
        self.decisions["uturn"] += int(dead_end.sum())
        turned = ~go_straight & ~dead_end
        self.decisions["forced_turn"] += int((turned & ~straight_ok).sum())
        self.decisions["turn"] += int((turned & straight_ok).sum())
        return new


def contacts(positions: np.ndarray, comm_range: float) -> np.ndarray:
    """(P, 2) int array of pairs ``i < j`` within ``comm_range``, sorted (deterministic)."""
    diff = positions[:, None, :] - positions[None, :, :]
    d2 = np.einsum("ijk,ijk->ij", diff, diff)
    i, j = np.nonzero(np.triu(d2 <= comm_range * comm_range, k=1))
    return np.stack([i, j], axis=1).astype(np.int64)


def contact_matrix(positions: np.ndarray, comm_range: float) -> np.ndarray:
    """(N, N) symmetric bool matrix of agents in range (diagonal False)."""
    diff = positions[:, None, :] - positions[None, :, :]
    d2 = np.einsum("ijk,ijk->ij", diff, diff)
    m = d2 <= comm_range * comm_range
    np.fill_diagonal(m, False)
    return m  # type: ignore[no-any-return]
