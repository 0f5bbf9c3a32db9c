"""Per-step wall time of the RL stage at rl.max_staleness = 0 and 1, runs alternated (docs/async.md).

    python benchmarks/async_steps.py RL_CONFIG.yaml --steps 20 --rounds 2 --configs 0@2,1@2,0@1 [--out FILE]

RL_CONFIG: the RL stage's config.yaml of a `rloo pipeline` run (its SFT policy and reward model).
`--configs`: max_staleness@threads (torch intra-op threads of the run; at N = 1 they are split
between producer and trainer), optionally followed by `:key=value` overrides of the RL config
(e.g. `1@2:reference_pass=trainer`). Each run is a fresh process (`--one`), so its threads and producer
start clean; the configurations alternate, round after round, so a machine shared with other work
slows them alike. A step's wall time is
the time between the starts of consecutive steps (sampling, scoring, update, the weight hand-off,
logging), taken by wrapping rloo_step; the first 3 steps (warm-up) are left out. Also the CPU
seconds per step (means over the same steps) of the trainer's process and of the producer's: on a loaded machine,
where wall time measures the scheduler more than rloo, max(trainer, producer) CPU per step is what
an idle machine with a core for each would take per step. Each run also
reports the medians of its logged phase times (time/rollout, time/score, time/update, and at N > 0
the producer's time/producer_sample, time/producer_score, time/producer_idle and time/trainer_wait).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WARMUP = 3


def one(config: str, staleness: int, threads: int, steps: int, extra: list[str] | None = None) -> dict:
    import torch

    torch.set_num_threads(threads)

    import rloo.algorithms.rloo as rloo_module
    from rloo import RLConfig, train
    from rloo.config.loading import load_config

    starts: list[tuple[float, float, float]] = []  # (wall, trainer CPU, producer CPU) at each step's start
    step = rloo_module.rloo_step

    def timed(*args, **kwargs):
        starts.append((time.perf_counter(), time.process_time(), producer_cpu()))
        return step(*args, **kwargs)

    rloo_module.rloo_step = timed
    with tempfile.TemporaryDirectory() as out:
        overrides = [f"steps={steps}", f"output_dir={out}", "eval_every=null", "save_every=null"]
        overrides += [f"max_staleness={staleness}", "sample_every=1000", *(extra or [])]
        cfg = load_config(RLConfig, config, overrides)
        history = [h for h in train(cfg, overwrite=True).history if "time/update" in h][WARMUP:]
    pairs = zip(starts[WARMUP:], starts[WARMUP + 1 :], strict=False)
    laps = [[b - a for a, b in zip(a3, b3, strict=True)] for a3, b3 in pairs]
    phases = {k: statistics.median(h[k] for h in history) for k in history[0] if k.startswith("time/")}
    wall = statistics.median(lap[0] for lap in laps)
    # CPU: the mean over the timed steps (/proc counts in ticks of 10 ms, too coarse for a median)
    trainer, producer = ((starts[-1][i] - starts[WARMUP][i]) / len(laps) for i in (1, 2))
    return {"max_staleness": staleness, "threads": threads, "median_step_s": wall} | {
        "cpu_per_step": {"trainer": trainer, "producer": producer},
        "phases": phases,
        "laps": [lap[0] for lap in laps],
    }


def producer_cpu() -> float:
    """CPU seconds (user + system) the rollout producer process has used so far; 0 without one."""
    import multiprocessing

    total = 0.0
    for child in multiprocessing.active_children():
        fields = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", default="0@2,1@2")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.one is not None:
        base, *extra = a.one.split(":")
        n, threads = (int(x) for x in base.split("@"))
        print(json.dumps(one(a.config, n, threads, a.steps, extra)))
        return
    runs = []
    for i in range(a.rounds):
        for c in a.configs.split(","):
            cmd = [sys.executable, __file__, a.config, "--steps", str(a.steps), "--one", c]
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs.append(json.loads(line) | {"config": c, "round": i})
            phases = " ".join(f"{k[5:]} {v:.4f}" for k, v in runs[-1]["phases"].items())
            cpu = runs[-1]["cpu_per_step"]
            print(
                f"round {i} {c}: median step {runs[-1]['median_step_s']:.4f} s, CPU/step trainer "
                f"{cpu['trainer']:.4f} producer {cpu['producer']:.4f} ({phases})",
                flush=True,
            )
    med = {c: statistics.median(r["median_step_s"] for r in runs if r["config"] == c) for c in a.configs.split(",")}
    print("median of run medians (s/step): " + ", ".join(f"{c} {m:.4f}" for c, m in med.items()))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "median_step_s": med, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
