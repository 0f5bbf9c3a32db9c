"""Per-step wall time of the RL stage at rl.max_staleness = 0 and 1, runs alternated (docs/async.md).

    python benchmarks/async_steps.py RL_CONFIG.yaml --steps 40 --pairs 3 [--out docs/async_steps.json]

RL_CONFIG: the RL stage's config.yaml of a `rloo pipeline` run (its SFT policy and reward model).
Each run is a fresh process (`--one N`), so its threads and producer start clean; runs alternate
N = 0, 1, 0, 1, ... so a machine shared with other work slows both alike. A step's wall time is
the time between the starts of consecutive steps (sampling, scoring, update, the weight hand-off,
logging), taken by wrapping rloo_step; the first 3 steps (warm-up) are left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

WARMUP = 3


def one(config: str, staleness: int, steps: int) -> dict:
    import torch

    import rloo.algorithms.rloo as rloo_module
    from rloo import RLConfig, train
    from rloo.config.loading import load_config

    starts: list[float] = []
    step = rloo_module.rloo_step

    def timed(*args, **kwargs):
        starts.append(time.perf_counter())
        return step(*args, **kwargs)

    rloo_module.rloo_step = timed
    with tempfile.TemporaryDirectory() as out:
        overrides = [f"steps={steps}", f"output_dir={out}", "eval_every=null", "save_every=null"]
        cfg = load_config(RLConfig, config, overrides + [f"max_staleness={staleness}", "sample_every=1000"])
        threads = torch.get_num_threads()
        train(cfg, overwrite=True)
    laps = [b - a for a, b in zip(starts[WARMUP:], starts[WARMUP + 1 :], strict=False)]
    return {"max_staleness": staleness, "threads": threads, "median_step_s": statistics.median(laps), "laps": laps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.config, a.one, a.steps)))
        return
    runs = []
    for i in range(2 * a.pairs):
        n = i % 2
        cmd = [sys.executable, __file__, a.config, "--steps", str(a.steps), "--one", str(n)]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        runs.append(json.loads(line))
        print(f"run {i}: max_staleness={n} median step {runs[-1]['median_step_s']:.4f} s", flush=True)
    med = {n: statistics.median(r["median_step_s"] for r in runs if r["max_staleness"] == n) for n in (0, 1)}
    result = {"command": " ".join(sys.argv), "median_step_s": med, "speedup_n1": med[0] / med[1], "runs": runs}
    print(f"median of run medians: N=0 {med[0]:.4f} s, N=1 {med[1]:.4f} s, N=0/N=1 = {result['speedup_n1']:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
