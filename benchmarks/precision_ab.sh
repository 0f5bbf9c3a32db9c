#!/usr/bin/env bash
# make demo and rloo compare --quick in float32 and under dtype=X (default auto), side by side in
# ABBA order, wall times in OUT/times.txt and each run's log and folder in OUT (docs/precision.md).
#   bash benchmarks/precision_ab.sh [OUT=runs/precision_ab] [DTYPE=auto]
set -u
out=${1:-runs/precision_ab}; other=${2:-auto}
mkdir -p "$out"
unset RLOO_AUTO_DTYPE
rloo=${RLOO:-.venv/bin/rloo}
run() {
    local name=$1; shift
    local start; start=$(date +%s.%N)
    "$@" > "$out/$name.log" 2>&1
    echo "$name rc=$? wall=$(echo "$(date +%s.%N) - $start" | bc) s" | tee -a "$out/times.txt"
}
i=0
for d in float32 "$other" "$other" float32; do
    i=$((i + 1)); run "demo-$d-$i" "$rloo" pipeline output_dir="$out/demo-$d-$i" dtype="$d" --overwrite
done
for d in "$other" float32 float32 "$other"; do
    i=$((i + 1)); run "quick-$d-$i" "$rloo" compare --quick output_dir="$out/quick-$d-$i" dtype="$d"
done
