"""The daemon's cordial round (issue 17): one Pairwise-10 agent trained on its peers' views.

Owns one agent's side of cordial learning between daemons: its slice of the fleet-wide
**shared index** (:func:`agent_data`: every node draws the same composites from the same
seed, with :func:`peerd.learn.pairwise10.make_draw`, and keeps only its own digit, so the
ids align without any image crossing the network), its network (:class:`CordialAgent`: the
simulator's LeNet-5-style agent, :class:`~peerd.learn.pairwise10.StackedAgents` with one
agent, plus the coordination layers Λ_j^i and c_i) and the two-time-scale training of
:class:`CordialLearner` (Adam on the embedding with ε_e = ε₀/(1+e/t₀)^0.6; the coordination
layers frozen for the first ``warmup_epochs`` epochs, then Adam with η_e = η₀/(1+(e−K)/t₀);
Table 1's values for P = 25).

Each round reads the freshest received view of every peer agent j (its h_j for the ids it
sent; an absent peer or id contributes zero, a coordination input that is missing), takes K
minibatch steps, evaluates on the validation and test ids and returns this agent's h_i for
every id of the index: the next view entry. The learner also says what of it a restart keeps
(:meth:`CordialLearner.snapshot` / :meth:`~CordialLearner.load`: the network, Adam's state,
the step count, the random stream, the epoch's remaining rows), so a restored agent continues
exactly where it stopped. Must not touch the network, the node state or the wire format
(peerd.daemon.modes.cordial wires those); no clock, randomness from the seed given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from torch.nn import functional as fn

from peerd.learn import learnerstate as ls
from peerd.learn.pairwise10 import TABLE1_P25, StackedAgents, load_images, make_draw
from peerd.store.learnerfile import Identity, LearnerState

#: The embedded output's width h_i (the agent's fc2) and the label classes.
WIDTH = 10
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class AgentData:
    """Agent ``index``'s digits of the shared composites: per split, images [R, 28, 28],
    labels [R] and the shared-index ids [R] (train, val and test ids are consecutive)."""

    index: int
    agents: int
    x: dict[str, torch.Tensor]
    y: dict[str, torch.Tensor]
    ids: dict[str, npt.NDArray[np.int64]]

    @property
    def size(self) -> int:
        """Ids in the shared index (all splits)."""
        return sum(len(v) for v in self.ids.values())


def index_size(per_digit: int) -> int:
    """Ids of the shared index: 9 tuples × P composites in each of train, val and test."""
    return 3 * 9 * per_digit


def agent_data(agents: int, index: int, per_digit: int, seed: int,
               images: tuple[dict[str, torch.Tensor], dict[str, np.ndarray]] | None = None,
               source: str = "mnist") -> AgentData:
    """Agent ``index`` of ``agents``: the simulator's draw ``seed`` (identical on every node),
    column ``index`` kept; composites of ``source``'s images (pairwise10.SOURCES) unless
    ``images`` are given."""
    if agents < 2 or agents % 2:
        raise ValueError(f"Pairwise-10 needs an even number of agents >= 2, got {agents}")
    if not 0 <= index < agents:
        raise ValueError(f"agent index {index} outside [0, {agents})")
    imgs, labels = load_images(source) if images is None else images
    draw = make_draw(agents, per_digit, seed, imgs, labels)
    x, y, ids, start = {}, {}, {}, 0
    for split in SPLITS:
        x[split] = draw.x[split][:, index].contiguous()
        y[split] = draw.y[split][:, index].contiguous()
        ids[split] = np.arange(start, start + len(y[split]), dtype=np.int64)
        start += len(y[split])
    return AgentData(index, agents, x, y, ids)


class CordialAgent(nn.Module):
    """Agent i: the embedding M_i and head of the simulator's network, and Λ_j^i [N, 10, 10]
    (row i unused) and c_i, zero at the start so the coordination term is too."""

    mask: torch.Tensor  # [N, 1, 1]: 0 at the own row

    def __init__(self, agents: int, index: int, dropout: float, gen: torch.Generator) -> None:
        super().__init__()
        self.net = StackedAgents(1, 1, dropout, False, gen)
        self.index, self.agents = index, agents
        self.lam = nn.Parameter(torch.zeros(agents, WIDTH, WIDTH))
        self.cbias = nn.Parameter(torch.zeros(WIDTH))
        mask = torch.ones(agents)
        mask[index] = 0.0  # never the own h_i: it reaches the head through W_i
        self.register_buffer("mask", mask[:, None, None])

    def coordination(self) -> list[nn.Parameter]:
        return [self.lam, self.cbias]

    def embedding(self) -> list[nn.Parameter]:
        return self.net.embedding()

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """h_i [B, 10] of images [B, 28, 28]."""
        out: torch.Tensor = self.net.embed(x[:, None])[:, 0]
        return out

    def logits(self, emb: torch.Tensor, recv: torch.Tensor | None) -> torch.Tensor:
        """Logits [B, 10] from h_i and the received h_j [B, N, 10] (None: no coordination)."""
        if recv is None:
            out: torch.Tensor = self.net.head(emb[:, None])[:, 0]
            return out
        lam = self.lam * self.mask
        msg = torch.einsum("jac,bjc->ba", lam, recv)
        out = self.net.head(emb[:, None], msg[:, None], self.cbias)[:, 0]
        return out


@dataclass(frozen=True, slots=True)
class PeerView:
    """A peer agent's freshest view: its h_j [m, 10] for the shared-index ``ids`` [m]."""

    agent: int
    ids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class CordialRoundOutput:
    train_loss: float
    val_loss: float
    val_accuracy: float
    test_loss: float
    test_accuracy: float
    #: h_i for every id of the shared index, float32 [size, 10]: the next view entry.
    views: npt.NDArray[np.float32]
    #: peer agent -> how many of the index's ids its view covered this round.
    coverage: dict[int, int]
    epoch: float


@dataclass
class CordialLearner:
    """One agent's model, optimisers and schedule across rounds (module docstring)."""

    data: AgentData
    coordination: bool = True
    warmup_epochs: int = 50
    batch_size: int = 65
    steps: int = 4
    seed: int = 0
    model: CordialAgent = field(init=False)
    done_steps: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.hyper = TABLE1_P25["cordial" if self.coordination else "isolated"]
        self.gen = torch.Generator().manual_seed(self.seed * 7919 + self.data.index)
        self.model = CordialAgent(self.data.agents, self.data.index, self.hyper.dropout,
                                  self.gen)
        self.opt = torch.optim.Adam(self.model.embedding(), lr=self.hyper.eps0)
        self.coord: torch.optim.Optimizer | None = None
        self._order = torch.empty(0, dtype=torch.int64)

    @property
    def epoch(self) -> float:
        rows = len(self.data.y["train"])
        return self.done_steps * self.batch_size / rows

    # --- kept across restarts (peerd.learn.learnerstate, peerd.store.learnerfile) ----------

    mode = "cordial"

    def identity(self) -> Identity:
        """Which agent of which shared index this learner is: another one's state never fits."""
        d = self.data
        return {"agent": d.index, "agents": d.agents, "ids": d.size, "seed": self.seed,
                "coordination": int(self.coordination)}

    def _names(self) -> dict[int, str]:
        return {id(p): name for name, p in self.model.named_parameters()}

    def expected(self, counts: Mapping[str, int]) -> ls.SchemaDict:
        """The tensors a saved state with ``counts`` must hold: the network, Adam's state of
        whichever optimisers had stepped, the random stream and the rest of the epoch's
        shuffled rows. ValueError for counts this learner cannot have."""
        rows = len(self.data.y["train"])
        order, coord = counts.get("order", -1), counts.get("coord", 0)
        if not 0 <= order <= rows or counts.get("done_steps", -1) < 0 or coord not in (0, 1) \
                or counts.get("opt", 0) not in (0, 1) or (coord and not self.coordination):
            raise ValueError(f"counters {dict(counts)} do not fit this learner")
        named = dict(self.model.named_parameters())
        out = ls.module_schema("model.", self.model)
        if counts.get("opt"):
            embedding = {id(p) for p in self.model.embedding()}
            out |= ls.adam_schema("opt.", {n: p for n, p in named.items() if id(p) in embedding})
        if coord:
            out |= ls.adam_schema("coord.", {n: named[n] for n in ("lam", "cbias")})
        out["rng"] = ("uint8", tuple(self.gen.get_state().shape))
        out["order"] = ("int64", (order,))
        return out

    def snapshot(self, round_no: int) -> LearnerState:
        """Everything the next round depends on, as arrays (views of the live tensors: save
        them before training again)."""
        names = self._names()
        arrays, bf16 = ls.module_arrays("model.", self.model)
        for prefix, opt in (("opt.", self.opt), ("coord.", self.coord)):
            if opt is not None:
                more, more_bf16 = ls.adam_arrays(prefix, opt, names)
                arrays |= more
                bf16 |= more_bf16
        arrays["rng"] = self.gen.get_state().numpy()
        arrays["order"] = self._order.numpy()
        counts = {"done_steps": self.done_steps, "order": len(self._order),
                  "opt": int(bool(self.opt.state)), "coord": int(self.coord is not None)}
        return LearnerState(self.mode, self.identity(), round_no, counts, arrays,
                            frozenset(bf16))

    def load(self, saved: LearnerState) -> None:
        """Continue from ``saved`` (already matched against :meth:`expected`). Values are
        checked before anything changes: a ValueError or RuntimeError leaves it fresh."""
        rows = len(self.data.y["train"])
        order = torch.from_numpy(np.array(saved.tensors["order"], copy=True))
        if len(order) and (int(order.min()) < 0 or int(order.max()) >= rows):
            raise ValueError(f"shuffled rows outside [0, {rows})")
        rng = torch.from_numpy(np.array(saved.tensors["rng"], copy=True))
        torch.Generator().set_state(rng)  # a state torch refuses raises here, not half-way
        for name in self.model.state_dict():  # a diverged agent is not brought back
            ls.check_not_exploded(name, saved.tensors["model." + name])
        names = self._names()
        ls.load_module("model.", self.model, saved)
        self.opt = torch.optim.Adam(self.model.embedding(), lr=self.hyper.eps0)
        if saved.counts["opt"]:
            ls.load_adam("opt.", self.opt, names, saved)
        self.coord = None
        if saved.counts["coord"]:
            self.coord = torch.optim.Adam(self.model.coordination(), lr=self.hyper.eta0)
            ls.load_adam("coord.", self.coord, names, saved)
        self.gen.set_state(rng)  # the network's dropout draws from it too: one generator
        self._order = order
        self.done_steps = saved.counts["done_steps"]

    def _batch(self) -> torch.Tensor:
        # Epochs of shuffled rows, as the simulator's; a round may end mid-epoch.
        if len(self._order) < self.batch_size:
            rows = len(self.data.y["train"])
            self._order = torch.cat([self._order, torch.randperm(rows, generator=self.gen)])
        batch, self._order = self._order[:self.batch_size], self._order[self.batch_size:]
        return batch

    def received(self, views: list[PeerView]) -> tuple[torch.Tensor, dict[int, int]]:
        """The h_j table [size, N, 10] (zero where absent) and each agent's id count."""
        table = torch.zeros(self.data.size, self.data.agents, WIDTH)
        coverage: dict[int, int] = {}
        for v in views:
            if v.agent == self.data.index or not 0 <= v.agent < self.data.agents \
                    or v.agent in coverage:
                continue  # own or unknown agents; a second origin of one agent: the freshest
            keep = v.ids < self.data.size
            ids = torch.from_numpy(v.ids[keep])
            table[ids, v.agent] = torch.from_numpy(v.vectors[keep])
            coverage[v.agent] = int(keep.sum())
        return table, coverage

    def loss(self, views: list[PeerView]) -> float:
        """Cross-entropy on the training ids with ``views`` (none, isolated), the network as it
        is, without dropout (peerd.learn.viewguard compares it before and after a round)."""
        table, _ = self.received(views)
        ids = torch.from_numpy(self.data.ids["train"])
        model = self.model
        was = model.training
        model.eval()
        with torch.no_grad():
            logits = model.logits(model.embed(self.data.x["train"]),
                                  table[ids] if self.coordination else None)
            out = float(fn.cross_entropy(logits, self.data.y["train"]))
        model.train(was)
        return out

    def round(self, views: list[PeerView]) -> CordialRoundOutput:
        """K steps on the received views, then evaluation and this agent's next view."""
        table, coverage = self.received(views)
        use = table if self.coordination else None
        model, h, x, y = self.model, self.hyper, self.data.x, self.data.y
        train_ids = torch.from_numpy(self.data.ids["train"])
        model.train()
        losses = []
        for _ in range(self.steps):
            e = self.epoch
            for group in self.opt.param_groups:
                group["lr"] = h.eps0 / (1.0 + e / h.t0) ** 0.6
            if self.coordination and e >= self.warmup_epochs:
                if self.coord is None:
                    self.coord = torch.optim.Adam(model.coordination(), lr=h.eta0)
                for group in self.coord.param_groups:
                    group["lr"] = h.eta0 / (1.0 + (e - self.warmup_epochs) / h.t0)
            rows = self._batch()
            recv = None if use is None else use[train_ids[rows]]
            loss = fn.cross_entropy(model.logits(model.embed(x["train"][rows]), recv),
                                    y["train"][rows])
            self.opt.zero_grad(set_to_none=True)
            if self.coord is not None:
                self.coord.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            self.opt.step()
            if self.coord is not None:
                self.coord.step()
            self.done_steps += 1
            losses.append(float(loss.detach()))
        model.eval()
        with torch.no_grad():
            embs = {s: model.embed(x[s]) for s in SPLITS}
            scores = {}
            for s in ("val", "test"):
                ids = torch.from_numpy(self.data.ids[s])
                logits = model.logits(embs[s], None if use is None else use[ids])
                scores[s] = (float(fn.cross_entropy(logits, y[s])),
                             float((logits.argmax(1) == y[s]).double().mean()))
            views_out = torch.cat([embs[s] for s in SPLITS]).numpy().astype(np.float32)
        return CordialRoundOutput(
            train_loss=float(np.mean(losses)) if losses else math.nan,
            val_loss=scores["val"][0], val_accuracy=scores["val"][1],
            test_loss=scores["test"][0], test_accuracy=scores["test"][1],
            views=views_out, coverage=coverage, epoch=self.epoch)
