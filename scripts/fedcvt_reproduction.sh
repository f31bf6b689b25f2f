#!/bin/bash
# The FedCVT reproduction (docs/reproduction.md, "FedCVT"): FedCVT vs vanilla vertical FL on
# aligned people only, breast_cancer and MNIST, 3 alignment fractions × 3 seeds, plus the
# ablations (no pseudo labels; no fill and no pseudo labels; a 0.9 gate). One thread per run,
# niced: the project's development machine has 2 cores shared with other work.
#   [PEERD=.venv/bin/peerd] [OUT=docs/reproduction] bash scripts/fedcvt_reproduction.sh
# Then render the tables into docs/reproduction.md: .venv/bin/python -m benchmarks.docs_tables --write
set -eu
PEERD=${PEERD:-.venv/bin/peerd}
OUT=${OUT:-docs/reproduction}
export OMP_NUM_THREADS=1
B="--dataset breast_cancer --aligned 0.05,0.1,0.3 --seeds 0,1,2"
M="--dataset mnist --aligned 0.01,0.05,0.1 --seeds 0,1,2 --steps 1000 --batch-size 128"
M="$M --hidden 256 --dim 64 --warmup-steps 200"
run() { nice -n 10 "$PEERD" sim fedcvt "$@"; }
# The seed's attention, softmax(QKᵀ/√d_k) (the default, --sharpen 0), for every table column...
run $B --out "$OUT/fedcvt-breast_cancer.json"
run $B --no-pseudo-labels --out "$OUT/fedcvt-breast_cancer-nopseudo.json"
run $M --out "$OUT/fedcvt-mnist.json"
run $M --no-pseudo-labels --out "$OUT/fedcvt-mnist-nopseudo.json"
run $M --no-pseudo-labels --no-fill --out "$OUT/fedcvt-mnist-nofill.json"
run $M --threshold 0.9 --out "$OUT/fedcvt-mnist-t09.json"
# ...and the paper's code's sharpening (T = 0.1; the default before issue 28) beside it.
run $B --sharpen 0.1 --out "$OUT/fedcvt-breast_cancer-sharpen01.json"
run $M --sharpen 0.1 --out "$OUT/fedcvt-mnist-sharpen01.json"
