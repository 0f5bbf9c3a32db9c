"""The seed table of a task played as episodes (calculator, guess): SFT and RLOO per seed, and the
RLOO - SFT differences paired by seed with their 95% t-interval over seeds (docs/agents.md).

    python benchmarks/agents_seeds.py [--rows] RUN_DIR [RUN_DIR ...]

RUN_DIR: the output_dir of one `rloo pipeline task=calculator|guess seed=S` run (its summary.json).
Prints a markdown table: per seed and metric "SFT -> RLOO", then the mean of each and of the paired
difference, mean ± half-width of the 95% Student-t interval (rloo.experiments.compare.tables.mean_ci).
`--rows`: one row per seed instead of one column (for ten seeds and more), the metrics as columns.
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


def tool_pass(e: dict) -> float | None:
    """Success rate among the episodes that called the tool: (pass - no-tool pass x no-tool share) /
    tool share; None without a tool call (or a task without a tool). Where every episode called the
    tool (share 0) the evaluation logs no no-tool pass (None): the tool pass is then the pass."""
    share, nt = e.get("no_tool_share"), e.get("no_tool_pass")
    if share == 0:
        return e["pass_at_1"]
    if share is None or nt is None or share >= 1:
        return None
    return (e["pass_at_1"] - nt * share) / (1 - share)


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.3f} -> {b:.3f}"


def seed_rows(runs: list[dict]) -> str:
    """One row per seed: success rate, its gain in points, tool calls and the success among them
    (SFT -> RLOO), wall time; then the means and the paired differences' 95% t-intervals over seeds."""
    cols = ["success rate SFT -> RLOO", "RLOO - SFT (points)", "tool calls / episode", "right when calling the tool"]
    rows = ["| seed | " + " | ".join(cols) + " | wall time (s) |", "|---" * 6 + "|"]
    for r in runs:
        sft, rl = r["sft"], r["policy"]
        secs = ", ".join(f"{k} {v:.0f}" for k, v in r["seconds"].items())
        cells = [
            _pair(sft["pass_at_1"], rl["pass_at_1"]),
            f"{100 * (rl['pass_at_1'] - sft['pass_at_1']):+.1f}",
            _pair(sft["tool_calls"], rl["tool_calls"]),
            _pair(tool_pass(sft), tool_pass(rl)),
        ]
        rows.append(f"| {r['seed']} | " + " | ".join(cells) + f" | {secs} |")
    means = [
        _pair(mean_ci([r["sft"][k] for r in runs])[0], mean_ci([r["policy"][k] for r in runs])[0])
        for k in ("pass_at_1", "tool_calls")
    ]
    gains = [100 * (r["policy"]["pass_at_1"] - r["sft"]["pass_at_1"]) for r in runs]
    rows.append(
        f"| mean of {len(runs)} | {means[0]} | {mean_ci(gains)[0]:+.1f} (smallest {min(gains):+.1f}) | {means[1]} | | |"
    )
    diffs = [fmt([r["policy"][k] - r["sft"][k] for r in runs]) for k in ("pass_at_1", "tool_calls")]
    rows.append(f"| RLOO - SFT, 95% t-CI paired by seed | {diffs[0]} | | {diffs[1]} | | |")
    return "\n".join(rows)


if __name__ == "__main__":
    args = sys.argv[1:]
    rows = "--rows" in args
    dirs = [a for a in args if a != "--rows"]
    if not dirs:
        sys.exit(__doc__)
    runs = [load(r) for r in dirs]
    print(seed_rows(runs) if rows else table(runs))
