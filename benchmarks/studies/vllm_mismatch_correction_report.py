"""The paired table of docs/results/vllm-mismatch/README.md: `rl.is_correction=tis` minus none (unset),
generation=vllm, per seed.

    python benchmarks/studies/vllm_mismatch_correction_report.py RUNS --tag vllm-bf16 --seeds 0,1,2

RUNS/seed<S>/<tag>/N0-none and N0-tis are the runs benchmarks/studies/async_learning.py made
(`run RUNS --settings 0:none,0:tis --tag TAG --train-args "generation=vllm dtype=bfloat16 ..."`). Prints
each seed's win rates (the evaluation stage's, 400 held-out prompts), the mean of the paired difference
in points with the half-width of its 95% t-interval over seeds, and per setting the logged mismatch
(`vllm/kl_mu_pi` mean over steps and seeds, `vllm/logprob_abs_max` largest) and, for tis, the
sequence ratios pi/mu (`is/ratio_min`, `is/ratio_max`: extremes over steps and seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}


def run(runs: Path, seed: int, tag: str, corr: str) -> tuple[float, list[dict]]:
    d = runs / f"seed{seed}" / tag / f"N0-{corr}"
    win = json.loads((d / "eval" / "summary.json").read_text())["policy"]["win_rate"]
    steps = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    return win, [s for s in steps if "vllm/kl_mu_pi" in s]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", type=Path)
    ap.add_argument("--tag", default="vllm-bf16")
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    res = {(s, c): run(a.runs, s, a.tag, c) for s in seeds for c in ("none", "tis")}
    print("| seed | none | tis | tis - none (points) |\n|---|---|---|---|")
    diffs = []
    for s in seeds:
        (wn, _), (wt, _) = res[(s, "none")], res[(s, "tis")]
        diffs.append(100 * (wt - wn))
        print(f"| {s} | {wn:.4f} | {wt:.4f} | {diffs[-1]:+.2f} |")
    half = T975[len(diffs) - 1] * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    print(
        f"\npaired difference tis - none: {statistics.fmean(diffs):+.2f} +- {half:.2f} points "
        f"(95% t, {len(diffs)} seeds)"
    )
    for c in ("none", "tis"):
        steps = [st for s in seeds for st in res[(s, c)][1]]
        line = (f"{c}: vllm/kl_mu_pi mean {statistics.fmean(st['vllm/kl_mu_pi'] for st in steps):.2e}, "
                f"vllm/logprob_abs_max {max(st['vllm/logprob_abs_max'] for st in steps):.3f}")  # fmt: skip
        if "is/ratio_min" in steps[0]:
            lo, hi = min(st["is/ratio_min"] for st in steps), max(st["is/ratio_max"] for st in steps)
            trunc = statistics.fmean(st["is/truncated"] for st in steps)
            line += f", pi/mu over sequences {lo:.3f} to {hi:.3f}, truncated {100 * trunc:.2f}%"
        print(line)


if __name__ == "__main__":
    main()
