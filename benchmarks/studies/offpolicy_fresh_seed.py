"""Does a fresh seed fall inside what the off-policy study claims for a new seed? (README, "A fresh seed")

    F=benchmarks/studies/offpolicy_fresh_seed.py   # the README: docs/results/offpolicy/README.md
    python $F predict docs/results/offpolicy/results.json.xz --cells 1e-3:0:paper,1e-3:16:tis,1e-3:16:topr
    python $F check RUNS docs/results/offpolicy/results.json.xz --seed 26 \
        --cells 1e-3:0:paper,1e-3:16:tis,1e-3:16:topr --log docs/results/offpolicy/fresh-seeds.jsonl

For cells C1, C2, ... (one lr and task) the differences are every later cell minus every earlier one,
paired by seed, in points. `predict` prints, per difference over the committed seeds: the mean ± 95%
t-interval (the table's), the Student-t prediction interval the README stated before (mean ± t s
sqrt(1 + 1/n): it assumes normal differences), the distribution-free one now stated
(rloo.experiments.intervals.order_prediction: [x_(j), x_(n+1-j)], exact coverage (n+1-2j)/(n+1);
with 10 seeds the range, 9/11 = 81.8%), and per cell the seeds that collapsed with the exact
(Clopper-Pearson) 95% interval of that rate. `check` runs one new seed of each cell exactly as the
study did (offpolicy_study.run_one into RUNS, whose `base` must be the study's SFT model) and says,
per difference, whether it falls inside the distribution-free interval; --log appends the numbers;
`table LOG` prints that log as the README's table (a row per seed, the count outside and expected).

Collapse (this study's rule, fixed before the fresh seeds): a run's score below half its SFT model's
(arithmetic pass@1 0.325 -> below 0.1625; the demo's win rate 0.409 -> below 0.2045, the README's
"below 0.2" up to rounding: no demo run lies between).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import offpolicy_study as study  # noqa: E402 - the study's runner and results format, beside this file

from rloo.experiments.intervals import order_prediction, outside_range_chance, split  # noqa: E402

SFT = {"pass@1": 0.325, "win_rate": 0.409}  # the README's SFT scores (RUNS/base, seed 0)


def collapsed(score: float, metric: str) -> bool:
    return score < SFT[metric] / 2


def pairs(cells: list[str]) -> list[tuple[str, str]]:
    """(a, b) for a - b: every later cell minus every earlier one."""
    return [(cells[i], cells[j]) for i in range(len(cells)) for j in range(i)]


def diffs(results: dict, a: str, b: str) -> list[float]:
    ra, rb = results[a], results[b]
    return [100 * (study.score(ra[s]) - study.score(rb[s])) for s in ra if s in rb]


def student_prediction(xs: list[float]) -> tuple[float, float]:
    """mean ± t_{0.975, n-1} s sqrt(1 + 1/n): the normal-theory interval the README stated before."""
    n, m = len(xs), statistics.fmean(xs)
    half = study.T975[n - 1] * statistics.stdev(xs) * math.sqrt(1 + 1 / n)
    return m - half, m + half


def label(cell: str) -> str:
    lr, n, corr = cell.split(":")
    return "N = 0" if corr == "paper" else f"{corr} (N = {n})"


DIFF_HEAD = (
    "| difference (points) | seeds | mean ± 95% CI | t prediction interval (before: assumes normality) | "
    "stated: distribution-free prediction interval (its coverage) |\n|---|---|---|---|---|"
)
RATE_HEAD = "| cell | seeds | collapsed | exact 95% interval of the rate (Clopper-Pearson) |\n|---|---|---|---|"


def predict(results: dict, cells: list[str]) -> list[str]:
    """The README's two tables: a row per difference, then a row per cell's collapse rate."""
    rows = [DIFF_HEAD]
    for a, b in pairs(cells):
        xs = diffs(results, a, b)
        mean, half = study.interval(xs)
        lo, hi = student_prediction(xs)
        pi = order_prediction(xs)
        rows.append(f"| {label(a)} - {label(b)} | {len(xs)} | {mean:+.1f} ± {half:.1f} | [{lo:+.1f}, {hi:+.1f}] | "
                    f"[{pi.lo:+.1f}, {pi.hi:+.1f}] ({100 * pi.coverage:.1f}%) |")  # fmt: skip
    rows += ["", RATE_HEAD]
    for c in cells:
        runs = list(results[c].values())
        metric = next(k for k in study.SCORE_KEYS if k in runs[0])
        sp = split([study.score(r) for r in runs], [collapsed(study.score(r), metric) for r in runs])
        rows.append(f"| {label(c)} | {sp.n} | {sp.collapsed} | [{sp.rate_lo:.2f}, {sp.rate_hi:.2f}] |")
    return rows


def verdicts(results: dict, cells: list[str], fresh: dict[str, float]) -> list[dict]:
    """Per difference: the fresh seed's value (points) and whether it lies in the committed seeds'
    distribution-free interval. `fresh`: cell -> the new seed's score."""
    out = []
    for a, b in pairs(cells):
        pi = order_prediction(diffs(results, a, b))
        x = 100 * (fresh[a] - fresh[b])
        out.append({"difference": f"{a} - {b}", "value": round(x, 2), "lo": round(pi.lo, 2), "hi": round(pi.hi, 2),
                    "coverage": round(pi.coverage, 4), "inside": pi.holds(x)})  # fmt: skip
    return out


def log_table(records: list[dict]) -> list[str]:
    """The README's table of `check`'s log (fresh-seeds.jsonl): a row per seed, a column per difference
    (its value and whether it fell outside), then the count outside and the count expected."""
    diffs_ = list(dict.fromkeys(r["difference"] for r in records))
    first = {d: next(r for r in records if r["difference"] == d) for d in diffs_}  # the interval's bounds
    heads = [f"{d} [{first[d]['lo']:+.1f}, {first[d]['hi']:+.1f}]" for d in diffs_]
    rows = ["| seed | " + " | ".join(heads) + " |", "|---" * (len(diffs_) + 1) + "|"]
    by_seed: dict[int, dict[str, dict]] = {}
    for r in records:
        by_seed.setdefault(r["seed"], {})[r["difference"]] = r
    for seed, got in by_seed.items():
        cells = [f"{got[d]['value']:+.1f}" + ("" if got[d]["inside"] else " outside") for d in diffs_]
        rows.append(f"| {seed} | " + " | ".join(cells) + " |")
    chances = []  # per difference: P(at least that many outside | all seeds exchangeable)
    for d in diffs_:
        got = [r for r in records if r["difference"] == d]
        n = round((1 + got[0]["coverage"]) / (1 - got[0]["coverage"]))  # the range's (n-1)/(n+1) -> n
        chances.append(f"{outside_range_chance(n, len(got), sum(not r['inside'] for r in got)):.3f}")
    rows.append("| chance of so many outside, were the seeds exchangeable | " + " | ".join(chances) + " |")
    out = sum(not r["inside"] for r in records)
    expected = sum(1 - r["coverage"] for r in records)
    rows.append(f"| outside | {out} of {len(records)} (expected {expected:.1f}) |" + " |" * (len(diffs_) - 1))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("what", choices=["predict", "check", "table"])
    ap.add_argument("paths", nargs="+", type=Path, help="predict: RESULTS; check: RUNS RESULTS; table: LOG")
    ap.add_argument("--cells", default="")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--steps", type=int, default=60, help="the study's RL steps (the demo: 100)")
    ap.add_argument("--eval-args", default="pass_samples=8")
    ap.add_argument("--log", type=Path)
    a = ap.parse_args(argv)
    cells = a.cells.split(",")
    if a.what == "table":  # check's log as the README's table
        print("\n".join(log_table([json.loads(x) for x in a.paths[0].read_text().splitlines() if x.strip()])))
        return
    if a.what == "predict":
        print("\n".join(predict(study.load(a.paths[0]), cells)))
        return
    runs, results = a.paths[0].absolute(), study.load(a.paths[1])
    fresh = {}
    for c in cells:  # one at a time, each exactly as the study ran it (a finished run is reused)
        study.run_one(runs, c, a.seed, a.steps, a.eval_args.split(), [])
        fresh[c] = next(iter((study.final_score(runs, c, a.seed) or {}).values()))
    for v in verdicts(results, cells, fresh):
        print(f"seed {a.seed}: {v['difference']} = {v['value']:+.1f}, interval [{v['lo']:+.1f}, {v['hi']:+.1f}] "
              f"({100 * v['coverage']:.1f}%): {'inside' if v['inside'] else 'OUTSIDE'}")  # fmt: skip
        if a.log:
            with a.log.open("a") as f:
                f.write(json.dumps({"seed": a.seed, "scores": fresh} | v) + "\n")


if __name__ == "__main__":
    main()
