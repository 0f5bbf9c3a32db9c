"""CPU seconds of the pieces of a `rloo compare` study: each SFT stage and each RL run, timed with
time.process_time() around rloo.experiments.compare.study's `sft` and `train` (one thread), to size a study
before it runs (docs/results/compare-agents/README.md).

    OMP_NUM_THREADS=1 python benchmarks/studies/compare_agents_cpu.py STUDY.yaml OUT_DIR [key=value ...]
    OMP_NUM_THREADS=1 python benchmarks/studies/compare_agents_cpu.py docs/results/compare-agents/study.yaml \
        /tmp/cost "seeds=[0]" "methods=[rloo]"

Runs the comparison (with the overrides) into OUT_DIR, overwriting it, then prints one JSON line:
{"sft": [cpu s per SFT stage], "rl": [cpu s per RL run], "total": cpu s of the whole call, "wall": s};
the difference total - sum(sft) - sum(rl) is the evaluations, reward models, loading and the report.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import rloo.experiments.compare.study as C
from rloo.config import CompareConfig, load_config

torch.set_num_threads(1)
TIMES: dict[str, list[float]] = {"sft": [], "rl": []}


def _timed(name: str, fn):
    def wrap(*args, **kwargs):
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[name].append(round(time.process_time() - t, 1))

    return wrap


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    C.sft, C.train = _timed("sft", C.sft), _timed("rl", C.train)
    cfg = load_config(CompareConfig, argv[0], [f"output_dir={argv[1]}", *argv[2:]])
    t, w = time.process_time(), time.perf_counter()
    C.compare(cfg, overwrite=True)
    total, wall = round(time.process_time() - t, 1), round(time.perf_counter() - w, 1)
    print(json.dumps({**TIMES, "total": total, "wall": wall}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
