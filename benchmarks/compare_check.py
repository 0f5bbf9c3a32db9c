"""Does a rerun of `rloo compare` reproduce a committed report?

    python benchmarks/compare_check.py docs/results/compare/results.json runs/compare-rerun/report/results.json

For every task and method in both files: the committed mean win rate (against the references and
against the SFT model) with its 95% t-interval over seeds, the rerun's mean, and whether the rerun's
mean lies inside the committed interval. With the same seeds on the same machine the runs are
deterministic, so the rerun's per-seed numbers are also compared exactly ("identical"). With other
seeds, the interval is the test: a mean of fresh seeds should fall inside it in most rows (not all:
a 95% interval for the mean is not a 95% interval for another sample's mean, which varies too).
Exit code 1 when any rerun mean falls outside. Last, with other seeds, the differences from RLOO
paired by seed over the seeds of both files together (the report's paired table, on more seeds).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from rloo.experiments.compare.tables import mean_ci, paired_differences

METRICS = ("win_rate", "win_rate_vs_sft")


def check(committed: dict, rerun: dict) -> tuple[list[str], int]:
    rows, outside = [], 0
    for task in committed:
        for method, runs in committed[task].items():
            again = rerun.get(task, {}).get(method)
            if not again or method == "sft":
                continue
            for metric in METRICS:
                m, h = mean_ci([r[metric] for r in runs])
                m2 = sum(r[metric] for r in again) / len(again)
                same = len(again) == len(runs) and all(
                    a[metric] == b[metric] for a, b in zip(again, runs, strict=False)
                )
                inside = h is not None and abs(m2 - m) <= h
                outside += not inside
                rows.append(
                    f"| {task} | {method} | {metric} | {m:.3f} ± {h or 0:.3f} | {m2:.3f} (n={len(again)}) | "
                    f"{'yes' if inside else 'NO'} | {'identical' if same else 'differs'} |"
                )
    return rows, outside


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    committed, rerun = (json.loads(open(p).read()) for p in argv)
    rows, outside = check(committed, rerun)
    print("| task | method | metric | committed mean ± 95% CI | rerun mean | inside | per-seed values |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{len(rows) - outside} of {len(rows)} rerun means inside the committed intervals")
    pooled = {t: {m: committed[t][m] + rerun.get(t, {}).get(m, []) for m in committed[t]} for t in committed}
    seeds = {r["seed"] for t in pooled for rs in pooled[t].values() for r in rs if "seed" in r}
    if len(seeds) > len({r.get("seed") for t in committed for rs in committed[t].values() for r in rs}):
        cfg = SimpleNamespace(
            tasks=list(committed), methods=[m for m in committed[next(iter(committed))] if m != "sft"]
        )
        print(f"\nDifferences from rloo paired by seed, seeds {sorted(seeds)}:\n")
        print(paired_differences(cfg, pooled))
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
