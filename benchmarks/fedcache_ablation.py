"""FedCache's loss ablation: eq. 18 as the notes write it vs the paper code's objective.

FashionMNIST, K = 300, Dirichlet α = 1, the large model for every client (the docs'
homogeneous runs), lr 0.01, batch 8, β = 1.5, T = 3, R = 16, with the paper's epoch rule (one
epoch of each client's own size) and eq. 9's zero knowledge at round 1 for both forms, plus
isolated (β = 0: plain CE, the same for both forms). Short: a few rounds, sized for a shared
small machine; each run's JSON is rewritten after every round, so a run cut short keeps its
curve. Writes ``docs/reproduction/fedcache-ablation/<variant>-s<seed>.json`` (the run's
summary and its provenance), one file per run so that variants can run as separate processes;
docs/reproduction.md's table is rendered from them
(:func:`benchmarks.reproduce_fedcache.ablation`).

    python -m benchmarks.fedcache_ablation --rounds 12 --seeds 0 --variants eq18

The same runs to convergence (issue 28): ``--plateau W,GAIN`` ends a run at the first round
where the best mean client accuracy of the last W rounds beats every earlier round's by less
than GAIN (:func:`peerd.sim.maua.plateau_round`), ``--rounds`` then being the cap; the JSON
records the rule and where it fired (``stop``). ``--dataset`` and ``--models`` give the other
settings (``mixed``: small / medium / large by client index mod 3).

    python -m benchmarks.fedcache_ablation --rounds 200 --plateau 20,0.002 --seeds 0 \
        --variants code --out docs/reproduction/fedcache-converged/fashion-mnist-large
"""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import _provenance
from benchmarks.reproduce import ROOT

if TYPE_CHECKING:
    from peerd.core.distill import DistillForm

OUT = ROOT / "docs" / "reproduction" / "fedcache-ablation"
#: (run name, algorithm, loss form, T): isolated trains no KL, so its form does not matter;
#: eq18-t1 is eq. 18 at T = 1, where its CE is plain CE (what T does to eq18, apart);
#: mobility is code's FedCache with knowledge only over the mobility model's contacts;
#: cached-dfl exchanges weights over the same contacts (no KL: its form does not matter).
VARIANTS: tuple[tuple[str, str, DistillForm, float], ...] = (
    ("eq18", "fedcache", "eq18", 3.0), ("code", "fedcache", "code", 3.0),
    ("isolated", "isolated", "eq18", 3.0), ("eq18-t1", "fedcache", "eq18", 1.0),
    ("mobility", "fedcache-mobility", "code", 3.0),
    ("cached-dfl", "cached-dfl", "code", 3.0))


class _Converged(Exception):  # noqa: N818 (not an error: the run's normal end)
    """Raised out of the checkpoint to end a run the plateau rule calls converged."""


def _parse_plateau(ap: argparse.ArgumentParser, text: str) -> tuple[int, float] | None:
    if not text:
        return None
    try:
        window, gain = text.split(",")
        parsed = int(window), float(gain)
    except ValueError:
        ap.error(f"--plateau wants W,GAIN (e.g. 20,0.002), got {text!r}")
    if parsed[0] < 1 or not 0 < parsed[1] < 1:
        ap.error(f"--plateau wants W >= 1 and 0 < GAIN < 1, got {text!r}")
    return parsed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seeds", default="0", help="comma list of seeds")
    ap.add_argument("--agents", type=int, default=300)
    ap.add_argument("--targets", default="0.6,0.7")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="eq18,code,isolated,eq18-t1",
                    help="comma list of " + ", ".join(v[0] for v in VARIANTS))
    ap.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist"))
    ap.add_argument("--models", default="large", choices=("large", "mixed"))
    ap.add_argument("--plateau", default="",
                    help="W,GAIN: stop when the last W rounds gain < GAIN over the best before")
    ap.add_argument("--out", type=Path, default=OUT, help="folder")
    args = ap.parse_args(argv)
    plateau = _parse_plateau(ap, args.plateau)
    started = _provenance.start(ap, args)
    import torch

    from peerd.sim.knowledge import KnowledgeResult, KnowledgeSimConfig, run_knowledge
    from peerd.sim.maua import plateau_round

    torch.set_num_threads(args.threads)
    base = KnowledgeSimConfig(dataset=args.dataset, agents=args.agents, rounds=args.rounds,
                              dirichlet=1.0, models=args.models, lr=0.01, batch_size=8, beta=1.5,
                              temperature=3.0, r=16, key_dim=64,
                              targets=tuple(float(t) for t in args.targets.split(",")))
    wanted = args.variants.split(",")
    unknown = set(wanted) - {v[0] for v in VARIANTS}
    if unknown:
        ap.error(f"unknown variant(s) {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, alg, form, temperature in (v for v in VARIANTS if v[0] in wanted):
            target = args.out / f"{name}-s{seed}.json"
            config = replace(base, seed=seed, algorithms=(alg,), distill_form=form,
                             temperature=temperature)

            def checkpoint(result: KnowledgeResult, target: Path = target, alg: str = alg
                           ) -> None:
                doc: dict[str, Any] = {**result.summary(), "provenance": started.record()}
                fired = (None if plateau is None
                         else plateau_round(result.curves[alg], *plateau))
                if plateau is not None:
                    doc["stop"] = {"rule": "plateau", "window": plateau[0],
                                   "min_gain": plateau[1], "round": fired,
                                   "cap": args.rounds}
                # Written whole and renamed: a run killed mid-write keeps its last round.
                tmp = target.with_suffix(".json.tmp")
                tmp.write_text(json.dumps(doc, indent=1) + "\n")
                tmp.replace(target)
                if fired is not None:
                    raise _Converged

            # The JSON the checkpoint wrote holds the run up to the round the rule fired.
            with contextlib.suppress(_Converged):
                run_knowledge(config, checkpoint=checkpoint)


if __name__ == "__main__":
    main()
