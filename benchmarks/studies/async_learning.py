"""Does lag hurt RLOO, and does the importance correction buy it back? (docs/async.md)

    python benchmarks/studies/async_learning.py run RUNS_DIR --seeds 0,1,2 --settings 0:none,1:tis,1:none,2:tis
    python benchmarks/studies/async_learning.py report RUNS_DIR --seeds 0,1,2 --settings ... [--out FILE]
    options of both: --tag NAME (the grid's folder, default `grid`), --train-args "lr=1e-3 ..." (given
    to every setting's `rloo train`), --metric pass@1 (a checker task's headline instead of win rate)

RUNS_DIR/seed<S> holds a finished `rloo pipeline seed=S output_dir=RUNS_DIR/seed<S>` (its SFT model and
reward model, trained once per seed and shared by every setting). `run` trains the RL stage again for
each setting N:correction (`rloo train -c seed<S>/rl/config.yaml max_staleness=N is_correction=...`,
everything else the pipeline's) into seed<S>/grid/N<N>-<correction>, then evaluates it like the
pipeline's evaluation stage (`rloo eval -c seed<S>/eval/config.yaml`, the same held-out prompts and
gold judge). Finished settings are skipped, so an interrupted grid continues. `report`: per setting the
mean final win rate over seeds, the paired difference to N = 0 (same seed: same SFT model, reward
model and evaluation prompts) in points with the half-width of its 95% t-interval over seeds, and the
logged importance-ratio stats (means over steps and seeds; min / max: the extremes of any step).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
RLOO = [sys.executable, "-m", "rloo.cli"]


GRID = "grid"  # seed<S>/<GRID>/N<n>-<corr>: --tag names another grid (e.g. one at a larger lr)
TRAIN_ARGS: list[str] = []  # --train-args: overrides given to every setting's `rloo train`
METRIC = "win_rate"  # --metric: the eval summary's headline number (pass@1 on a checker task)


def setting_dir(runs: Path, seed: int, setting: str) -> Path:
    n, corr = setting.split(":")
    return runs / f"seed{seed}" / GRID / f"N{n}-{corr}"


def run_one(runs: Path, seed: int, setting: str) -> None:
    out = setting_dir(runs, seed, setting)
    if (out / "eval" / "summary.json").exists():
        return
    n, corr = setting.split(":")
    base = runs / f"seed{seed}"
    paper = corr == "none" and n == "0"  # is_correction unset: the paper's update
    train = [f"output_dir={out}", f"max_staleness={n}", *TRAIN_ARGS]
    train += [] if paper else [f"is_correction={corr}"]
    subprocess.run([*RLOO, "train", "-c", str(base / "rl" / "config.yaml"), *train, "--overwrite"], check=True)
    ev = [f"policy={out / 'model'}", f"output_dir={out / 'eval'}", "baseline=null"]
    subprocess.run([*RLOO, "eval", "-c", str(base / "eval" / "config.yaml"), *ev, "--overwrite"], check=True)
    print(f"done seed {seed} {setting}", flush=True)


def ratio_stats(metrics: Path) -> dict[str, float]:
    """Means over the run's steps of the logged is/ stats (is/ratio_max: the largest of any step)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows = [r for r in rows if "is/ratio_mean" in r]
    if not rows:
        return {}
    out = {k: statistics.fmean(r[k] for r in rows) for k in ("is/ratio_mean", "is/truncated", "is/masked")}
    out["is/ratio_max"] = max(r["is/ratio_max"] for r in rows)
    out["is/ratio_min"] = min(r["is/ratio_min"] for r in rows)
    return out


def headline(summary: dict) -> float:
    """The policy's win rate against the references, or its pass@1 (`--metric pass@1`: the mean
    over problems of the fraction of correct samples, on a checker task such as `arithmetic`)."""
    policy = summary["policy"]
    if METRIC == "win_rate":
        return policy["win_rate"]
    return policy["pass"]["pass_at_k"]["1"]["mean"]


def win_rate(runs: Path, seed: int, setting: str) -> float | None:
    f = setting_dir(runs, seed, setting) / "eval" / "summary.json"
    return headline(json.loads(f.read_text())) if f.exists() else None


def report(runs: Path, seeds: list[int], settings: list[str]) -> list[dict]:
    base = {s: win_rate(runs, s, "0:none") for s in seeds}
    table = []
    for setting in settings:
        wins = {s: win_rate(runs, s, setting) for s in seeds}
        # seed -> (win rate, the lag-0 run's): the seeds both runs have finished, in seed order
        pairs = {s: (w, b) for s in seeds if (w := wins[s]) is not None and (b := base[s]) is not None}
        done = list(pairs)
        row = {"setting": setting, "seeds": done, "win_rate": {s: w for s, (w, _) in pairs.items()}}
        if done:
            row["mean"] = statistics.fmean(w for w, _ in pairs.values())
            diffs = [w - b for w, b in pairs.values()]
            row["diff"] = statistics.fmean(diffs)
            if len(diffs) > 1:
                row["ci95"] = T975[len(diffs) - 1] * statistics.stdev(diffs) / math.sqrt(len(diffs))
            stats = [ratio_stats(setting_dir(runs, s, setting) / "metrics.jsonl") for s in done]
            if stats[0]:
                row["is"] = {k: statistics.fmean(st[k] for st in stats) for k in stats[0]}
        table.append(row)
    return table


def markdown(table: list[dict], seeds: list[int]) -> str:
    """The table of docs/results/async-learning/README.md."""
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [
        f"| N | correction | {head} | mean | minus N = 0, 95% CI | mean rho | min / max rho | truncated | masked |",
        "|---|---|" + "---|" * (len(seeds) + 6),
    ]
    for row in table:
        if not row["seeds"]:
            continue
        n, corr = row["setting"].split(":")
        wins = " | ".join(f"{row['win_rate'][s]:.3f}" if s in row["win_rate"] else "-" for s in seeds)
        diff = f"{100 * row['diff']:+.1f}" + (f" ± {100 * row['ci95']:.1f}" if "ci95" in row and n != "0" else "")
        st = row.get("is")
        ratios = (
            f"{st['is/ratio_mean']:.4f} | {st['is/ratio_min']:.2f} / {st['is/ratio_max']:.2f} | "
            f"{100 * st['is/truncated']:.2f}% | {100 * st['is/masked']:.2f}%"
            if st
            else "- | - | - | -"
        )
        lines.append(f"| {n} | {corr} | {wins} | {row['mean']:.3f} | {diff if n != '0' else '-'} | {ratios} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["run", "report"])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--settings", default="0:none,1:tis,1:none,2:tis,2:none,4:tis,4:none,1:mis,2:mis,4:mis")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tag", default="grid", help="the grid's folder name under seed<S>/")
    ap.add_argument("--train-args", default="", help="space-separated KEY=VALUE for every `rloo train`")
    ap.add_argument("--metric", default="win_rate", choices=["win_rate", "pass@1"])
    a = ap.parse_args()
    global GRID, TRAIN_ARGS, METRIC
    GRID, TRAIN_ARGS, METRIC = a.tag, a.train_args.split(), a.metric
    seeds, settings = [int(s) for s in a.seeds.split(",")], a.settings.split(",")
    if a.what == "run":
        for setting in settings:  # setting after setting, so a grid cut short has whole settings
            for seed in seeds:
                run_one(a.runs, seed, setting)
        return
    table = report(a.runs, seeds, settings)
    print(markdown(table, seeds))
    if a.out:
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "table": table}, indent=1))


if __name__ == "__main__":
    main()
