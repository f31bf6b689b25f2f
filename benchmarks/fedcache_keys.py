"""Retrieval quality of FedCache's sample keys against raw-input cosine
(``peerd.learn.keys.measure``), written with the run's provenance (issue 28 item 2):
docs/reproduction.md's "Sample keys" table is rendered from the two outputs
(:func:`benchmarks.docs_outputs.fedcache_keys`).

    .venv/bin/python -m benchmarks.fedcache_keys --dataset fashion-mnist \\
        --json docs/reproduction/fedcache-keys-fashion-mnist.json
    .venv/bin/python -m benchmarks.fedcache_keys --dataset mnist \\
        --json docs/reproduction/fedcache-keys-mnist.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import _provenance
from peerd.learn.keys import measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The defaults of `python -m peerd.learn.keys`, which prints the same readings.
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--key-dims", default="16,64,256")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--fleet-id", default="reproduction")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    started = _provenance.start(ap, args)
    out = measure(args.dataset, key_dims=[int(d) for d in args.key_dims.split(",")],
                  k=args.k, queries=args.queries, fleet_id=args.fleet_id.encode())
    out["provenance"] = started.record()
    args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
