"""Knowledge mode (FedCache without a server) between real daemons in network namespaces.

Three `peerd run` processes, three architectures (``small`` / ``medium`` / ``large``: 5k, 31k
and 79k parameters on 8×8 digits), one fleet, mDNS on: every node's cache must hold both
peers' knowledge entries (and their keys beside it), and every node must learn better than
it does alone. "Alone" is computed here, in-process, by the very code the daemon runs
(:func:`peerd.learn.knowround.run_knowledge_round`) with the same data, initial weights and
per-round seeds but no peers: until the first knowledge arrives the daemon's round *is* that
run, bit for bit, so the two curves differ by the knowledge alone. Compared: the mean
validation accuracy over the first ``ROUNDS`` rounds (the learning curve's area), per node.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from peerd.core.distill import Distillation
from peerd.core.staleness import Clock
from peerd.learn.knowcache import KnowledgeCache
from peerd.learn.knowround import (
    KnowledgeRoundInput,
    encode_keys,
    knowledge_schema,
    run_knowledge_round,
    task_model,
)
from peerd.learn.tasks import load_task
from tests.integration.mesh import Node, make_fleet, start, status, wait_for, write_overrides
from tests.net.netns import NetnsHost

MODELS = ("small", "medium", "large")
ROUNDS = 10
LEARNING = {"mode": "knowledge", "round_interval_s": 2.0, "local_steps": 5, "batch_size": 32,
            "lr": 0.05, "distill_beta": 4.0, "distill_temperature": 2.0, "distill_r": 16,
            "capacity": 2}
# Every node runs [learning.knowledge] form = "code" (set below, beside its model): the
# paper code's loss, CE + β·T²·KL(teacher ‖ student), which this test was written and tuned
# for: with eq. 18 as written (knowledge mode's default since issue 28, there at T = 1) at
# this test's T = 2 and these steps, lr and β every model learns far slower (measured: mean
# val accuracy 0.35 / 0.21 / 0.12 with peers against 0.30 / 0.22 / 0.09 alone), so "beats
# learning alone" does not hold for every model.
#: Six Dirichlet(1.0) slices of digits, nodes 0-2: ~300 label-skewed samples each, where a
#: node alone sees some digits rarely (measured: the knowledge gain is largest there).
TASK = {"name": "digits", "partition": "dirichlet:1.0", "node_count": 6}
ROUND_LINE = re.compile(
    r"round (\d+): version \d+, loss [\d.na]+, val acc ([\d.]+), knowledge from (\d+) peers")


def curve(node: Node) -> dict[int, tuple[float, int]]:
    """Round -> (validation accuracy, peers whose knowledge it used), from the daemon's log."""
    return {int(m[1]): (float(m[2]), int(m[3])) for m in ROUND_LINE.finditer(node.logs())}


def alone(node: Node, index: int, model: str, rounds: int) -> list[float]:
    """The daemon's knowledge round without any peer, for ``rounds`` rounds."""
    torch.set_num_threads(1)  # as the daemon trains ([node] torch_threads = 1)
    task = load_task("digits", partition_spec="dirichlet:1.0", node_index=index, node_count=6,
                     seed=0)
    net = task_model(task, model)
    data = task.data()
    schema, encoder = knowledge_schema(b"\0" * 16, task, net, key_dim=64, max_samples=16384)
    keys = encode_keys(encoder, data.X_train)
    cache = KnowledgeCache(64, schema.num_classes)
    policy = Distillation(beta=4.0, temperature=2.0, r=16, form="code")
    out = []
    for r in range(rounds):
        seed = int.from_bytes(hashlib.sha256(f"{node.id}/{r}".encode()).digest()[:8])
        inp = KnowledgeRoundInput(own_id=node.id, clock=Clock.time(0.0), peers=[],
                                  policy=policy, steps=5, batch_size=32, lr=0.05, seed=seed,
                                  zero_untaught=r == 0)  # round1_knowledge = "zero"
        res = run_knowledge_round(net, data, keys, cache, inp, len(data.y_train))
        assert res.val_accuracy is not None
        out.append(res.val_accuracy)
    return out


def test_three_architectures_share_knowledge_and_beat_learning_alone(
    tmp_path: Path, running: list[Node], lan: Callable[[int], list[NetnsHost]]
) -> None:
    nodes = make_fleet(tmp_path, 3, hosts=lan(3), mdns=True, learning=LEARNING, task=TASK)
    for node, model in zip(nodes, MODELS, strict=True):
        write_overrides(node.config, task={"model": model},
                        **{"learning.knowledge": {"form": "code"}})
    start(nodes, running)

    def settled() -> bool:
        for node in nodes:
            s = node.status()
            if s is None or s["node"]["round"] < ROUNDS:
                return False
            peers = {c["origin"] for c in s["cache"] if c["kind"] == "knowledge"}
            if peers != {o.id for o in nodes if o is not node}:
                return False
        return True

    wait_for(settled, 240, f"{ROUNDS} rounds and both peers' knowledge everywhere", nodes)
    report = []
    for i, (node, model) in enumerate(zip(nodes, MODELS, strict=True)):
        s = status(node)
        rows = {c["origin"]: c for c in s["cache"]}
        for other in nodes:
            if other is not node:
                assert rows[other.id]["kind"] == "knowledge"
                assert rows[other.id]["examples"] > 100  # its samples, ~300 each
        assert s["entry_bytes"].get("received/keys", 0) > 0  # keys came, once per peer
        assert s["rejected"] == {}
        together = curve(node)
        assert set(range(1, ROUNDS + 1)) <= set(together), node.logs()[-2000:]
        mine = [together[r][0] for r in range(1, ROUNDS + 1)]
        baseline = alone(node, i, model, ROUNDS)
        # Until knowledge arrived (usually round 1; a peer that started earlier may push
        # before the first round) the daemon ran the same computation as the baseline: the
        # comparison is fair (the log shows three decimals).
        for r in range(1, ROUNDS + 1):
            if together[r][1] > 0:
                break
            assert abs(together[r][0] - baseline[r - 1]) <= 5e-4, (mine, baseline)
        report.append((model, statistics.mean(mine), statistics.mean(baseline)))
    print("mean val accuracy, rounds 1-10 (model, with peers, alone):", report)  # with -s
    for _model, with_peers, by_itself in report:
        assert with_peers > by_itself, report
