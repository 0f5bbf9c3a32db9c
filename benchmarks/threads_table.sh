#!/usr/bin/env bash
# The measurements of docs/results/threads/README.md: `rloo sft num_examples=3000 epochs=1` and a
# 6-step `rloo train` at 1 thread, 2 threads as before rloo's thread policy (libgomp's default spin,
# GOMP_SPINCOUNT=300000), 2 threads with the policy's spin, and the policy itself (no setting),
# beside 0, 8 and 2 busy-loop processes (benchmarks/threads_load.py starts and kills them). Each
# phase writes its JSON; the README says which phases ran there and which were stopped.
#   bash benchmarks/threads_table.sh OUT_DIR     (from the repository root; PY= picks the python)
set -euo pipefail
OUT=${1:?usage: threads_table.sh OUT_DIR}
PY=${PY:-python}
W=$OUT/work
mkdir -p "$W"
RLOO=("$PY" -m rloo.cli)
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
# the train command's policy and reward model (not timed)
[ -d "$W/rm/model" ] || OMP_NUM_THREADS=1 "${RLOO[@]}" sft num_examples=3000 epochs=1 output_dir="$W/sft0" --overwrite >/dev/null 2>&1
[ -d "$W/rm/model" ] || OMP_NUM_THREADS=1 "${RLOO[@]}" reward sft_model="$W/sft0/model" num_pairs=1000 epochs=1 output_dir="$W/rm" --overwrite >/dev/null 2>&1
SFT=("${RLOO[@]}" sft num_examples=3000 epochs=1 output_dir="$W/sft" --overwrite)
TRAIN=("${RLOO[@]}" train policy="$W/sft0/model" reward_model="$W/rm/model" steps=6 output_dir="$W/rl" --overwrite)
bench() { "$PY" benchmarks/threads_load.py "$@"; }
V3=(--variant 1t:OMP_NUM_THREADS=1 --variant policy: --variant 2t:OMP_NUM_THREADS=2,GOMP_SPINCOUNT=300000)
V=("${V3[@]}" --variant 2t-spin:OMP_NUM_THREADS=2)
# On the shared machine every 2-thread run with libgomp's default spin took minutes: each run is capped
# by --timeout (reported as "> N s"), and beside busy loops there is one round of three variants, to
# keep those phases short (they slow everyone on the machine).
bench --busy 0 --rounds 3 --timeout 400 "${V[@]}" --json "$OUT/sft_0.json" -- "${SFT[@]}"
bench --busy 8 2 --rounds 1 --timeout 240 "${V3[@]}" --json "$OUT/sft_8_2.json" -- "${SFT[@]}"
bench --busy 0 --rounds 2 --timeout 150 "${V[@]}" --json "$OUT/train_0.json" -- "${TRAIN[@]}"
bench --busy 8 2 --rounds 1 --timeout 120 "${V3[@]}" --json "$OUT/train_8_2.json" -- "${TRAIN[@]}"
