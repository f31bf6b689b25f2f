"""FedCache in the simulator: knowledge exchange beside Cached-DFL weight exchange.

The FedCache experiment (seed ``fedcache-notes-zh.txt`` §5): K clients, a Dirichlet(α) split
of the training set and a test split with the same label mix per client, one local epoch per
round (SGD, lr 0.01, batch 8), β = 1.5, R = 16; MAUA = the maximum over evaluated rounds of
the clients' mean accuracy, each on its own test split (:mod:`peerd.sim.maua`, beside the mean
of each client's own best, which is not MAUA); the traffic every method moved.

* ``fedcache``: every round of every client is the core round with blend policy ``none`` and
  local policy :class:`peerd.core.distill.Distillation`; teachers come from a
  :class:`peerd.learn.knowcache.KnowledgeCache` holding every other client's latest
  knowledge (all-to-all contact: what FedCache's server gives, without one). Models may
  differ: ``--model mixed`` assigns small / medium / large by client index mod 3.
* ``fedcache-mobility``: the same clients, but each keeps its own knowledge cache, filled
  only at the mobility model's contacts (the Cached-DFL caches' rule: C entries, τ_max,
  relayed), what the daemon does without a server
  (:class:`peerd.sim.knowledge_fedcache.OverContacts`).
* ``isolated``: the same clients and models, local cross-entropy only (β = 0 distillation).
* ``cached-dfl``: weight exchange on the same partition and test splits, over the mobility
  model (:mod:`peerd.sim.mobility`); weights need one architecture, so every client runs the
  large model. Its traffic is every model an exchange actually moved (the daemon's
  Digest/Want fetches only what the merge keeps).

All methods draw the same mini-batches (:func:`peerd.sim.train.draw_batches`).

**The paper's forms and the old ones** (each a config key and a ``peerd sim`` flag; a run's
JSON names all four, and a JSON without them was measured with the old forms,
:data:`peerd.sim.fedcache_forms.OLD_FORMS`):

* ``distill_form``: ``eq18`` (default, with T = 1 unless ``temperature`` is set) or ``code``
  (the paper code's loss, T = 3), :attr:`peerd.core.distill.Distillation.form`; the docs'
  converged runs measured the two level in MAUA on FashionMNIST and ``code`` ~1.4 points
  higher on MNIST; eq. 18 at T = 3 trained worse than isolated.
* ``local_epoch``: ``client`` (default): one local epoch is ``ceil(n_k / B)`` steps for client
  k, each its own count (the last batch tops up from the next shuffle, so it is full);
  ``mean``: ``ceil(mean n_k / B)`` steps for every client (the old rule; with α = 1 and
  K = 300 that is 0.46–3.03 of a client's epoch). Cached-DFL's batched trainer needs one step
  count, so ``cached-dfl`` runs always use ``mean`` (its JSON says so).
* ``round1_knowledge``: ``zero`` (default): eq. 9 initialises every sample's knowledge to C
  zeros, so at round 1 every sample has a teacher and τ(0) is uniform; ``none``: round 1
  trains CE only (the old behaviour: the cache is empty).
* ``index_bytes``: the width of the sample index uploaded with each row of logits (and with
  each key at initialisation), §4.1: "私有样本的logits及其索引被上传". 4 (default) is an int32
  per row, what a K = 300 x 200-sample fleet needs and what an encoder would send; 0 is the
  old count (float16 logits only). Downlinked teachers carry no index: the server answers the
  upload in its order. Gossip all-to-all counts it too on every knowledge batch (peerd's
  knowledge entries carry int32 ``ids``, ``protocol/knowledge.py``) but not on keys (a keys
  entry's row is its id).

Traffic to a target accuracy (the paper's acc@, Table 5's caption): for each target in
``targets`` the first evaluated round whose mean client accuracy reaches it and the
server-equivalent bytes moved by then (``acc_at`` in the JSON; ``null`` when never reached),
beside the total to the last round.
This module is the driver (:func:`run_knowledge`, ``peerd sim``'s entry); the config is
:mod:`peerd.sim.knowledge_config`, the data, model stacks and metrics
:mod:`peerd.sim.knowledge_data`, the knowledge runs :mod:`peerd.sim.knowledge_fedcache` and
the weight run :mod:`peerd.sim.knowledge_weights`. None decides anything of a round (the
core round does) or touches the network.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from peerd.learn.data import DataError, check_partition_spec
from peerd.sim.knowledge_config import (
    F16,
    KNOWLEDGE_ALGORITHMS,
    LOCAL_EPOCHS,
    MIXED,
    ROUND1_KNOWLEDGE,
    KnowledgeSimConfig,
    config_json,
)
from peerd.sim.knowledge_data import client_test_split, make_setup
from peerd.sim.knowledge_fedcache import run_fedcache
from peerd.sim.knowledge_weights import run_cached_dfl
from peerd.sim.maua import CURVE_COLUMNS, MAUA_DEFINITION
from peerd.sim.provenance import Started

__all__ = ["F16", "KNOWLEDGE_ALGORITHMS", "LOCAL_EPOCHS", "MIXED", "ROUND1_KNOWLEDGE",
           "KnowledgeResult", "KnowledgeSimConfig", "client_test_split", "config_json",
           "knowledge_cli", "run_knowledge"]


@dataclass
class KnowledgeResult:
    config: KnowledgeSimConfig
    #: per algorithm: per evaluated round, (round, mean accuracy, mean of client best so far,
    #: bytes so far) (:data:`~peerd.sim.maua.CURVE_COLUMNS`; MAUA so far is the running
    #: maximum of the second column)
    curves: dict[str, list[tuple[int, float, float, int]]] = field(default_factory=dict)
    #: per algorithm: the paper's MAUA (max over rounds of the mean client accuracy)
    maua: dict[str, float] = field(default_factory=dict)
    #: per algorithm: the mean over clients of each client's best round (not MAUA)
    mean_of_client_best: dict[str, float] = field(default_factory=dict)
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per algorithm, per target (as text): the first round reaching it and the bytes by then
    acc_at: dict[str, dict[str, dict[str, int] | None]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"config": config_json(self.config), "maua_definition": MAUA_DEFINITION,
                "maua": self.maua, "mean_of_client_best": self.mean_of_client_best,
                "traffic_bytes": self.traffic, "acc_at": self.acc_at, "info": self.info,
                "curve_columns": list(CURVE_COLUMNS),
                "curves": {a: [list(row) for row in c] for a, c in self.curves.items()}}



# ------------------------------------------------------------------ driver


def run_knowledge(config: KnowledgeSimConfig,
                  progress: Callable[[str, int], None] | None = None,
                  checkpoint: Callable[[KnowledgeResult], None] | None = None
                  ) -> KnowledgeResult:
    """Every algorithm of ``config`` on one partition; deterministic for a given config.

    ``checkpoint`` gets the result so far after every round (a run cut short by a time
    limit still leaves its curves)."""
    config.validate()
    setup = make_setup(config)
    result = KnowledgeResult(config)
    result.info = {"train_samples_per_client_mean": float(np.mean([len(p) for p in setup.train])),
                   "test_samples_per_client_mean": float(np.mean([len(p) for p in setup.test])),
                   "local_steps_per_round": setup.steps,
                   "local_steps_mean_rule": setup.mean_steps, "seconds": {}}
    for alg in config.algorithms:
        start = time.perf_counter()

        def tick(t: int, out: dict[str, Any], alg: str = alg, start: float = start) -> None:
            rest = dict(out)
            result.curves[alg] = list(rest.pop("curve"))
            result.maua[alg] = rest.pop("maua")
            result.mean_of_client_best[alg] = rest.pop("mean_of_client_best")
            result.traffic[alg] = rest.pop("traffic")
            result.acc_at[alg] = rest.pop("acc_at")
            result.info[alg] = rest
            result.info["seconds"][alg] = round(time.perf_counter() - start, 1)
            if progress is not None:
                progress(alg, t)
            if checkpoint is not None:
                checkpoint(result)

        if alg == "cached-dfl":
            run_cached_dfl(config, setup, tick)
        else:
            run_fedcache(config, setup, alg, tick)
    return result


def knowledge_cli(*, dataset: str, partition: str, agents: int, rounds: int,
                  algorithms: tuple[str, ...], models: str, lr: float, batch_size: int,
                  beta: float, temperature: float | None, r: int, key_dim: int, seed: int,
                  eval_every: int, capacity: int, tau_max: float, round_seconds: int,
                  out: Path, json_output: bool, distill_form: str = "eq18",
                  local_epoch: str = "client", round1_knowledge: str = "zero",
                  index_bytes: int = 4, targets: tuple[float, ...] = (0.6, 0.7),
                  provenance: Started | None = None) -> None:
    """``peerd sim --algorithms fedcache,...``: run, write ``out/fedcache.json`` (with the
    run's ``provenance`` record when given, its wall time as of each checkpoint), print.

    Start-up errors are one line on stderr and exit 2."""
    try:
        alpha = check_partition_spec(partition)
        if not partition.startswith("dirichlet:"):
            raise ValueError("fedcache runs need --partition dirichlet:ALPHA (the paper's split)")
        config = KnowledgeSimConfig(
            dataset=dataset, agents=agents, rounds=rounds, dirichlet=alpha, models=models,
            algorithms=algorithms, lr=lr, batch_size=batch_size, beta=beta,
            temperature=temperature, r=r, key_dim=key_dim, seed=seed, eval_every=eval_every,
            capacity=capacity, tau_max=tau_max, round_seconds=round_seconds,
            distill_form=distill_form, local_epoch=local_epoch,  # type: ignore[arg-type]
            round1_knowledge=round1_knowledge, index_bytes=index_bytes, targets=targets)
        config.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

    def progress(alg: str, t: int) -> None:
        if not json_output:
            print(f"\r{alg} round {t}/{rounds}", end="", file=sys.stderr, flush=True)

    out.mkdir(parents=True, exist_ok=True)
    target = out / "fedcache.json"

    def checkpoint(result: KnowledgeResult) -> None:
        # Written whole and renamed: a run killed mid-write leaves the last complete round.
        tmp = target.with_suffix(".json.tmp")
        doc = result.summary()
        if provenance is not None:
            doc = {**doc, "provenance": provenance.record()}
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(target)

    try:
        result = run_knowledge(config, progress, checkpoint)
    except (DataError, ValueError) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    summary = result.summary()
    if json_output:
        print(json.dumps(summary))
        return
    print(file=sys.stderr)
    for alg in config.algorithms:
        print(f"{alg:>10}: MAUA {100 * result.maua[alg]:.2f} % (mean of client best "
              f"{100 * result.mean_of_client_best[alg]:.2f} %)  traffic "
              + ", ".join(f"{k} {v / 1e9:.4f} GB" for k, v in result.traffic[alg].items()
                          if k.endswith(("equivalent", "all", "exchanged"))))
        for goal, hit in result.acc_at[alg].items():
            print(f"{'':>10}  acc@{goal}: " + ("not reached" if hit is None else
                  f"round {hit['round']}, {hit['bytes'] / 1e9:.4f} GB"))
    print(f"wrote {out / 'fedcache.json'}")

