#!/usr/bin/env bash
# The measurements of docs/results/threads/README.md: `rloo sft num_examples=3000 epochs=1` and a
# 6-step `rloo train` at 1 thread, 2 threads as before rloo's thread policy (libgomp's default spin,
# GOMP_SPINCOUNT=300000), 2 threads with the policy's spin, and the policy itself (no setting),
# beside 0, 2 and 8 busy-loop processes (benchmarks/threads_load.py starts and kills them).
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
V=(--variant 1t:OMP_NUM_THREADS=1 --variant policy: --variant 2t-spin:OMP_NUM_THREADS=2 --variant 2t:OMP_NUM_THREADS=2,GOMP_SPINCOUNT=300000)
# On the shared machine every 2-thread run with libgomp's default spin took minutes: capped by --timeout
# (a capped run is reported as "> N s"), one round beside busy loops, to keep those phases short.
[ -n "${SKIP_SFT0:-}" ] || bench --busy 0 --rounds 3 --timeout 400 "${V[@]}" --json "$OUT/sft_0.json" -- "${SFT[@]}"
bench --busy 8 --rounds 1 --timeout 240 "${V[@]}" --json "$OUT/sft_8.json" -- "${SFT[@]}"
bench --busy 0 --rounds 2 --timeout 150 "${V[@]}" --json "$OUT/train_0.json" -- "${TRAIN[@]}"
bench --busy 8 --rounds 1 --timeout 150 "${V[@]}" --json "$OUT/train_8.json" -- "${TRAIN[@]}"
bench --busy 2 --rounds 1 --timeout 240 "${V[@]}" --json "$OUT/sft_2.json" -- "${SFT[@]}"
bench --busy 2 --rounds 1 --timeout 150 "${V[@]}" --json "$OUT/train_2.json" -- "${TRAIN[@]}"
