#!/usr/bin/env bash
# The prepared GPU run (see benchmarks/gpu_check.py for what it does and how to bring the wheels the
# offline GPU machine lacks). Usage, from the repository root: bash benchmarks/gpu_check.sh [--no-trl] [--out F]
# [--parts bench] (the bench is a call of its own: docs/results/gpu-check, "How to run the next lending").
# The whole run is capped at 9.5 minutes; each part inside has its own limit and the JSON is written after each.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout 570 python3 benchmarks/gpu_check.py "$@"
