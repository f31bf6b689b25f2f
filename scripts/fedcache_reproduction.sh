#!/bin/bash
# The FedCache reproduction (docs/reproduction.md, "FedCache"): eight K = 300 FashionMNIST runs
# in parallel, 2 threads each, every one cut at LIMIT seconds (the runner rewrites its JSON
# after every round, so a cut run keeps its curves). Each run is the same as
#   peerd sim --dataset fashion-mnist --partition dirichlet:1.0 --agents 300 --rounds 400 \
#     --lr 0.01 --batch-size 8 --beta 1.5 --temperature 3 --neighbours R --key-dim 64 \
#     --capacity 10 --tau-max 5 --round-interval-s 120 --algorithms ALG --model MODELS \
#     --distill-form code --local-epoch mean --round1-knowledge none --index-bytes 0
# (the forms these runs were measured with, before the paper's became the defaults)
# run through knowledge_cli directly, so that a machine with torch but without peerd's other
# dependencies (typer, libp2p) can run it with PYTHONPATH=. (the docs' runs: 16 cores).
#   OUT=folder [SET=main|extra] [PY=python] [LIMIT=470] [K=300] [CARRY=.devcarry] \
#     bash scripts/fedcache_reproduction.sh
# SET=main: the docs' comparison and R ablation; SET=extra: seed 1 and the α ∈ {3, 10} ablation.
set -u
PY=${PY:-.venv/bin/python}
OUT=${OUT:?set OUT to the output folder}
LIMIT=${LIMIT:-470}
K=${K:-300}
if [ -n "${CARRY:-}" ]; then  # a bare machine: faiss wheel and FashionMNIST carried along
  $PY -m pip install -q --no-deps "$CARRY"/faiss_cpu-*.whl
  mkdir -p /usr/share/datasets && cp -r "$CARRY"/fashion-mnist /usr/share/datasets/
fi
export PYTHONPATH=$PWD OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=
mkdir -p "$OUT"
go() { # name algorithm models R [seed] [alpha]
  timeout "$LIMIT" "$PY" -c "
from pathlib import Path
from peerd.sim.knowledge import knowledge_cli
knowledge_cli(dataset='fashion-mnist', partition='dirichlet:${6:-1.0}', agents=$K, rounds=400,
  algorithms=('$2',), models='$3', lr=0.01, batch_size=8, beta=1.5, temperature=3.0, r=$4,
  key_dim=64, seed=${5:-0}, eval_every=1, capacity=10, tau_max=5.0, round_seconds=120,
  out=Path('$OUT/$1'), json_output=True, distill_form='code', local_epoch='mean',
  round1_knowledge='none', index_bytes=0)" > /dev/null 2> "$OUT/$1.err" &
}
if [ "${SET:-main}" = main ]; then
  go fc-homo fedcache large 16
  go fc-mixed fedcache mixed 16
  go iso-homo isolated large 16
  go iso-mixed isolated mixed 16
  go cdfl cached-dfl large 16
  go fc-r1 fedcache large 1
  go fc-r4 fedcache large 4
  go fc-r64 fedcache large 64
else
  go fc-homo-s1 fedcache large 16 1
  go iso-homo-s1 isolated large 16 1
  go fc-mixed-s1 fedcache mixed 16 1
  go iso-mixed-s1 isolated mixed 16 1
  go fc-a3 fedcache large 16 0 3.0
  go iso-a3 isolated large 16 0 3.0
  go fc-a10 fedcache large 16 0 10.0
  go iso-a10 isolated large 16 0 10.0
fi
wait
for f in "$OUT"/*.err; do echo "== $f"; tail -c 600 "$f"; done
rm -f "$OUT"/*.err "$OUT"/*/*.tmp
