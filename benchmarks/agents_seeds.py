"""The seed table of a task played as episodes (calculator, guess): SFT and RLOO per seed, and the
RLOO - SFT differences paired by seed with their 95% t-interval over seeds (docs/agents.md).

    python benchmarks/agents_seeds.py RUN_DIR [RUN_DIR ...]

RUN_DIR: the output_dir of one `rloo pipeline task=calculator|guess seed=S` run (its summary.json).
Prints a markdown table: per seed and metric "SFT -> RLOO", then the mean of each and of the paired
difference, mean ± half-width of the 95% Student-t interval (rloo.experiments.compare.tables.mean_ci).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rloo.experiments.compare.tables import mean_ci

METRICS = {
    "pass_at_1": "success rate (pass@1)",
    "turns": "turns / episode",
    "tool_calls": "tool calls / episode",
    "reward": "reward / episode",
    "truncated": "truncated",
}


def load(run: str) -> dict:
    s = json.loads((Path(run) / "summary.json").read_text())
    return {"seed": s["seed"], "sft": s["eval"]["baseline"], "policy": s["eval"]["policy"], "seconds": s["seconds"]}


def fmt(xs: list[float]) -> str:
    m, h = mean_ci(xs)
    return f"{m:+.3f}" if h is None else f"{m:+.3f} ± {h:.3f} [{m - h:+.3f}, {m + h:+.3f}]"


def table(runs: list[dict]) -> str:
    seeds = [r["seed"] for r in runs]
    per_seed = " | ".join(f"seed {s}: SFT -> RLOO" for s in seeds)
    head = f"| metric | {per_seed} | SFT mean | RLOO mean | RLOO - SFT (95% t-CI, paired by seed) |"
    rows = [head, "|---" * (len(seeds) + 4) + "|"]
    for key, name in METRICS.items():
        sft, rl = [r["sft"][key] for r in runs], [r["policy"][key] for r in runs]
        cells = [f"{a:.3f} -> {b:.3f}" for a, b in zip(sft, rl, strict=True)]
        diff = [b - a for a, b in zip(sft, rl, strict=True)]
        means = f"{mean_ci(sft)[0]:.3f} | {mean_ci(rl)[0]:.3f}"
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {means} | {fmt(diff)} |")
    nt = [r["sft"].get("no_tool_pass") for r in runs]
    if all(v is not None for v in nt) and any(r["sft"]["no_tool_share"] < 1 for r in runs):
        share = " | ".join(
            f"{v:.3f} ({r['sft']['no_tool_share']:.2f} of episodes)" for v, r in zip(nt, runs, strict=True)
        )
        rows.append(f"| no-tool baseline: SFT success without a tool call | {share} | {mean_ci(nt)[0]:.3f} | | |")
    secs = " | ".join(", ".join(f"{k} {v:.0f}s" for k, v in r["seconds"].items()) for r in runs)
    rows.append(f"| wall time (s) | {secs} | | | |")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(table([load(r) for r in sys.argv[1:]]))
