"""Who speaks for a cordial agent (issue 24 item 2), measured in-process.

Three sensor agents (real ``Daemon`` objects, views carried by in-memory gossip sessions, as
tests/daemon/test_cordial_views_attack.py drives them: seed 4, 10 s buckets, local_steps 10,
batch 5) run ROUNDS rounds; before each round of agent 0 an attacker signs a view of constant
VALUE into cache group ``agent-1``: fleet member M (bound to no agent), or agent 1's own key
(bound, so only the view bound can stop it). Printed per case: agent 0's held-out loss per
round and what its node refused; then a restart of agent 0 from its saved learner file. With
``--unfixed`` the binding check, the view bound and the round guard are patched out (the code
before issue 24; the learner file check stays, so the restart line shows what it does to a
diverged agent). With ``--json PATH`` the same readings go to PATH with the run's provenance
(docs/reliability.md's table is rendered from the two committed outputs by
:func:`benchmarks.docs_outputs.cordial_views`).

    .venv/bin/python -m benchmarks.cordial_views --window 64 --rounds 10 [--unfixed] \
        [--json docs/reliability/cordial-views-w64-{fixed,unfixed}.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import peerd.daemon.modes.cordial as cordial
import tests.daemon.test_sensor_mode as sensor_mode
from benchmarks import _provenance
from peerd.core.entry import EntryMeta
from peerd.core.reasons import Reason
from peerd.daemon.daemon import Daemon
from peerd.learn import viewguard
from peerd.learn.cordialround import PeerView
from peerd.learn.viewguard import GuardedLearner
from peerd.node.knowstate import ViewRows
from peerd.protocol.manifest import Manifest
from tests.daemon import test_cordial_views_attack as attack

T = TypeVar("T")
CASES: list[tuple[str, float | None, str]] = [
    ("clean", None, "mallory"), ("+10 by M", 10.0, "mallory"),
    ("+1000 by M", 1000.0, "mallory"), ("+10 by agent 1", 10.0, "agent-1"),
    ("+1000 by agent 1", 1000.0, "agent-1")]


def _no_refusal(manifest: Manifest, meta: EntryMeta) -> Reason | None:
    return None


def _old_select(self: cordial.ViewGate) -> list[tuple[int, ViewRows]]:
    """The round's choice before issue 24: the freshest view of each group agent-<j>."""
    out: list[tuple[int, ViewRows]] = []
    for v in self.node.views():
        agent = cordial.agent_of(v.group)
        if agent is None or agent == self.index or agent >= self.agents \
                or any(a == agent for a, _ in out):
            continue
        out.append((agent, v))
    return out


def _unguarded(learner: GuardedLearner, run: Callable[[list[PeerView]], T],
               views: list[PeerView]) -> tuple[T, list[int]]:
    return run(views), []


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--unfixed", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the readings here")
    args = ap.parse_args()
    started = _provenance.start(ap, args)
    cases: list[dict[str, object]] = []
    sensor_mode.WINDOW = attack.WINDOW = args.window
    attack.ROUNDS = args.rounds
    fixed = (cordial.view_refusal, cordial.ViewGate.select)
    if args.unfixed:  # the guard stays out for the restarts too: they run no round
        viewguard.guarded_round = _unguarded
    grab = _Lines()
    logging.getLogger().addHandler(grab)
    logging.getLogger("peerd.learn.learnerstate").setLevel(logging.INFO)
    for label, value, signer in CASES:
        if args.unfixed:
            cordial.view_refusal = _no_refusal
            cordial.ViewGate.select = _old_select  # type: ignore[method-assign]
        with tempfile.TemporaryDirectory() as d:
            losses, daemons, _ = attack._run(Path(d), value=value, signer=signer)
            print(f"window {args.window} {'unfixed' if args.unfixed else 'fixed'} {label}: "
                  "agent 0 held-out loss by round " + " ".join(f"{v:.3g}" for v in losses)
                  + f"; refused {dict(daemons[0].node.rejected)}")
            cordial.view_refusal, cordial.ViewGate.select = fixed  # type: ignore[method-assign]
            grab.lines.clear()
            Daemon(daemons[0].cfg, clock=daemons[0].now)
            said = [line for line in grab.lines if "local learner" in line]
            restart = said[0] if said else "nothing said about the learner"
            print("  restart: " + restart)
            cases.append({"label": label, "value": value, "signer": signer,
                          "losses": losses, "refused": dict(daemons[0].node.rejected),
                          "restart": restart.replace(d, "$TMP")})
    if args.json is not None:
        out = {"window": args.window, "rounds": args.rounds, "unfixed": args.unfixed,
               "cases": cases, "provenance": started.record()}
        # NaN and Inf stay JSON's non-standard tokens, which Python reads back.
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
