"""The daemon's cordial round for sensors (issue 17): one §6.1 linear agent on time buckets.

Owns one sensor agent's side of cordial learning between daemons: its **window** (the last W
buckets it observed, with its own inputs x_i and labels y_i, :mod:`peerd.learn.sensors`), its
linear model (the embedding M_i [m, d] and the coordination layers Λ_j^i [m, m], started from
the paper's random draw for this seed) and the training of :class:`SensorLearner`: each step
is Algorithm 1 for this agent alone (:func:`peerd.core.cordial.agent_step`: two disjoint
batches B_t^0, B_t^1 of the window's buckets, residualised local variables, M_i on ε(t) and
Λ_j^i on the slower η(t)); with ``coordination`` off, SGD on the isolated loss
(:func:`peerd.core.cordial.isolated_step`) with the same ε(t), the baseline.

Each round: the window takes in the buckets up to now; it trains on the buckets some peer's
view covers (every bucket, isolated; a peer absent from a bucket counts as zero input, as in
the Pairwise-10 round); the covered buckets it has not trained on yet are first scored as the
held-out set (squared error of the prediction M_i x_i + Σ_j Λ_j^i (h_j − Q_j x_i), Q_j the
window's estimate of M_j R̃_j^i; isolated: M_i x_i); then it returns h_i = M_i x_i for every
bucket of the window, ids sorted: the next view entry. The learner says what a restart keeps
(:meth:`SensorLearner.snapshot` / :meth:`~SensorLearner.load`). Must not touch the network,
the node state or the wire format (peerd.daemon.modes.sensors wires those); no clock: the
round is given the current bucket.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from peerd.core import cordial as cl
from peerd.core.timebuckets import VIEW_IDS, window_ids
from peerd.learn import learnerstate as ls
from peerd.learn.cordialround import PeerView
from peerd.learn.linearproblem import M_OUT, D
from peerd.learn.sensors import SensorFleet
from peerd.store.learnerfile import Identity, LearnerState

#: The batch size of Algorithm 1 in §6.1 (each of B_t^0 and B_t^1).
PAPER_BATCH = 10
#: The leave-one-out covariance needs 2 samples per batch, two batches per step.
MIN_BATCH = 2


@dataclass(frozen=True, slots=True)
class SensorRoundOutput:
    #: Mean squared error of the step batches (before each step); NaN when none was taken.
    train_loss: float
    #: Mean squared error on the held-out buckets (covered, not yet trained on); NaN if none.
    val_loss: float
    held_out: int
    #: h_i for the window's buckets, float32 [w, m], in the order of ``ids``: the next view.
    views: npt.NDArray[np.float32]
    #: The window's ids, int32, strictly increasing.
    ids: npt.NDArray[np.int32]
    #: peer agent -> how many of the window's buckets its view covered this round.
    coverage: dict[int, int]
    #: Iterations t taken so far (the step-size schedules' clock).
    iterations: int


@dataclass
class SensorLearner:
    """One sensor agent's model, window and schedule across rounds (module docstring)."""

    fleet: SensorFleet
    index: int
    window: int = 64
    coordination: bool = True
    batch_size: int = PAPER_BATCH
    steps: int = 10
    bucket_s: float = 10.0
    sizes: cl.StepSizes = field(default_factory=cl.StepSizes)
    iterations: int = field(default=0, init=False)

    mode = "cordial"

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.fleet.agents:
            raise ValueError(f"agent index {self.index} outside [0, {self.fleet.agents})")
        if not 2 * MIN_BATCH <= self.window < VIEW_IDS:
            raise ValueError(f"window must be in [{2 * MIN_BATCH}, {VIEW_IDS}), got "
                             f"{self.window}")
        prob = self.fleet.problem
        self.m = prob.m0[0, self.index].clone()  # [m, d]: the paper's initial draw
        self.lam = prob.lam0[0, self.index].clone()  # [N, m, m]; the own row is zero
        self.gen = torch.Generator().manual_seed(self.fleet.seed * 7919 + self.index)
        self.buckets: list[int] = []
        self.x = torch.zeros(0, D, dtype=torch.float64)
        self.y = torch.zeros(0, M_OUT, dtype=torch.float64)
        #: Buckets up to this one were trained on or scored (the held-out set is newer).
        self.seen = -1

    # --- the window -------------------------------------------------------------------------

    def observe(self, now_bucket: int) -> None:
        """Take in the buckets after the newest held, up to ``now_bucket``; keep the last W."""
        first = max(now_bucket - self.window + 1, self.buckets[-1] + 1 if self.buckets else 0)
        new = list(range(max(first, 0), now_bucket + 1))
        keep = [b for b in self.buckets if b > now_bucket - self.window]
        drop = len(self.buckets) - len(keep)
        x, y = self.fleet.observe(self.index, new)
        self.buckets = keep + new
        self.x, self.y = torch.cat([self.x[drop:], x]), torch.cat([self.y[drop:], y])

    def received(self, views: list[PeerView]
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
        """The h_j table [w, N, m] over the window (zero where absent), which buckets some
        peer covers [w] and each agent's count. An id maps to the window's bucket on that
        place of the ring; other ids are ignored."""
        n = self.fleet.agents
        table = torch.zeros(len(self.buckets), n, M_OUT, dtype=torch.float64)
        present = torch.zeros(len(self.buckets), dtype=torch.bool)
        where = {b % VIEW_IDS: row for row, b in enumerate(self.buckets)}
        coverage: dict[int, int] = {}
        for v in views:
            if v.agent == self.index or not 0 <= v.agent < n or v.agent in coverage \
                    or v.vectors.ndim != 2 or v.vectors.shape[1] != M_OUT:
                continue  # own, unknown or a second origin of one agent (the freshest won)
            pairs = [(where[int(i)], k) for k, i in enumerate(v.ids) if int(i) in where]
            if pairs:
                rows, cols = zip(*pairs, strict=True)
                table[list(rows), v.agent] = torch.from_numpy(
                    v.vectors[list(cols)].astype(np.float64))
                present[list(rows)] = True
            coverage[v.agent] = len(pairs)
        return table, present, coverage

    # --- the round --------------------------------------------------------------------------

    def predict(self, e: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """ŷ_i [k, m] for window ``rows``; Q_j = M_j R̃_j^i estimated on the ``ref`` rows."""
        x = self.x[rows]
        out = x @ self.m.T
        if not self.coordination:
            return out
        q = torch.zeros(self.fleet.agents, M_OUT, D, dtype=torch.float64)
        if len(ref):
            q = torch.einsum("kja,kd->jad", e[ref], self.x[ref]) / len(ref)
        resid = e[rows] - torch.einsum("jad,kd->kja", q, x)
        lam = self.lam.clone()
        lam[self.index] = 0.0
        return out + torch.einsum("jab,kjb->ka", lam, resid)

    def loss(self, views: list[PeerView]) -> float:
        """Mean squared error on the window's buckets ``views`` cover (all, isolated), the
        model as it is (peerd.learn.viewguard compares it before and after a round); NaN with
        fewer than 2 such buckets."""
        e, present, _ = self.received(views)
        rows = torch.arange(len(self.buckets))[present if self.coordination
                                               else torch.ones_like(present)]
        if len(rows) < MIN_BATCH:
            return math.nan
        with torch.no_grad():
            return float(((self.y[rows] - self.predict(e, rows, rows)) ** 2).sum(1).mean())

    def round(self, now_bucket: int, views: list[PeerView]) -> SensorRoundOutput:
        """Observe up to ``now_bucket``, score the held-out buckets, take K steps, publish."""
        self.observe(now_bucket)
        e, present, coverage = self.received(views)
        rows_all = torch.arange(len(self.buckets))
        covered = present if self.coordination else torch.ones_like(present)
        newer = torch.tensor([b > self.seen for b in self.buckets], dtype=torch.bool)
        held, pool = rows_all[covered & newer], rows_all[covered]
        val = math.nan
        if len(held):
            ref = rows_all[covered & ~newer]
            with torch.no_grad():
                val = float(((self.y[held] - self.predict(e, held, ref)) ** 2).sum(1).mean())
            self.seen = max(self.buckets[int(r)] for r in held)
        losses = [self._step(e, pool) for _ in range(self.steps)]
        taken = [v for v in losses if v is not None]
        h = (self.x @ self.m.T).numpy()
        ids, order = window_ids(self.buckets)
        # A view's values are bounded on the wire (MAX_VIEW_ABS); a diverged agent still
        # publishes (clipped, NaN as 0) rather than failing its round: signing refuses NaN.
        views_out = np.clip(np.nan_to_num(h[order], nan=0.0), -1000.0, 1000.0
                            ).astype(np.float32)
        return SensorRoundOutput(
            train_loss=float(np.mean(taken)) if taken else math.nan, val_loss=val,
            held_out=len(held), views=views_out, ids=ids, coverage=coverage,
            iterations=self.iterations)

    def _step(self, e: torch.Tensor, pool: torch.Tensor) -> float | None:
        """One iteration on two disjoint batches drawn from the ``pool`` rows."""
        b = min(self.batch_size, len(pool) // 2)
        if b < MIN_BATCH:
            return None
        pick = pool[torch.randperm(len(pool), generator=self.gen)[:2 * b]]
        r0, r1 = pick[:b], pick[b:]
        x0, y0, t = self.x[r0], self.y[r0], self.iterations
        if self.coordination:
            loss = float(((y0 - self.predict(e, r0, r1)) ** 2).sum(1).mean())
            self.m, self.lam = cl.agent_step(self.m, self.lam, self.index, e[r0], x0, y0, e[r1],
                                             self.x[r1], t, self.sizes)
        else:
            loss = float(((y0 - x0 @ self.m.T) ** 2).sum(1).mean())
            self.m = cl.isolated_step(self.m[None, None], x0[None, :, None], y0[None, :, None],
                                      t, self.sizes)[0, 0]
        self.iterations += 1
        return loss

    # --- kept across restarts (peerd.learn.learnerstate, peerd.store.learnerfile) ----------

    def identity(self) -> Identity:
        """Which agent of which sensor fleet this is: another one's state never fits."""
        return {"task": "sensors", "agent": self.index, "agents": self.fleet.agents,
                "seed": self.fleet.seed, "coordination": int(self.coordination),
                "window": self.window, "bucket_s": f"{self.bucket_s!r}"}

    def expected(self, counts: Mapping[str, int]) -> ls.SchemaDict:
        """The tensors a saved state with ``counts`` must hold. ValueError for counts this
        learner cannot have."""
        held = counts.get("buckets", -1)
        if not 0 <= held <= self.window or counts.get("iterations", -1) < 0 \
                or counts.get("seen", -2) < -1:
            raise ValueError(f"counters {dict(counts)} do not fit this learner")
        n = self.fleet.agents
        return {"m": ("float64", (M_OUT, D)), "lam": ("float64", (n, M_OUT, M_OUT)),
                "buckets": ("int64", (held,)),
                "rng": ("uint8", tuple(self.gen.get_state().shape))}

    def snapshot(self, round_no: int) -> LearnerState:
        """Everything the next round depends on (the window's data is redrawn from its
        bucket numbers: a function of the seed)."""
        arrays = {"m": self.m.numpy(), "lam": self.lam.numpy(),
                  "buckets": np.asarray(self.buckets, dtype=np.int64),
                  "rng": self.gen.get_state().numpy()}
        counts = {"buckets": len(self.buckets), "iterations": self.iterations,
                  "seen": self.seen}
        return LearnerState(self.mode, self.identity(), round_no, counts, arrays)

    def load(self, saved: LearnerState) -> None:
        """Continue from ``saved`` (already matched against :meth:`expected`). Values are
        checked before anything changes: a ValueError or RuntimeError leaves it fresh."""
        m = torch.from_numpy(np.array(saved.tensors["m"], copy=True))
        lam = torch.from_numpy(np.array(saved.tensors["lam"], copy=True))
        if not (bool(torch.isfinite(m).all()) and bool(torch.isfinite(lam).all())):
            raise ValueError("a non-finite M_i or Λ_j^i")
        ls.check_not_exploded("M_i", saved.tensors["m"])
        ls.check_not_exploded("Λ_j^i", saved.tensors["lam"])
        buckets = [int(b) for b in saved.tensors["buckets"]]
        if any(b < 0 for b in buckets) or any(b >= c for b, c in itertools.pairwise(buckets)) \
                or (buckets and buckets[-1] - buckets[0] >= self.window):
            raise ValueError("the saved window's buckets are not a window")
        rng = torch.from_numpy(np.array(saved.tensors["rng"], copy=True))
        torch.Generator().set_state(rng)  # a state torch refuses raises here, not half-way
        x, y = self.fleet.observe(self.index, buckets)
        lam[self.index] = 0.0
        self.m, self.lam, self.buckets, self.x, self.y = m, lam, buckets, x, y
        self.gen.set_state(rng)
        self.iterations, self.seen = saved.counts["iterations"], saved.counts["seen"]
