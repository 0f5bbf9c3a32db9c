"""What did tuning change? A tuned `rloo compare` against the untuned one, paired by seed.

    python benchmarks/tuned_vs_untuned.py runs/compare-tuned/report/results.json \
        docs/results/compare/results.json docs/results/compare/rerun-seeds345-results.json

The first file is the tuned comparison; the others are untuned comparisons on some of the same
seeds (their runs are merged by seed). With the first file alone, the untuned runs are its own
`<method>@untuned` runs (`tuning.untuned: true`: made in the same cells, on the same SFT models):

    python benchmarks/tuned_vs_untuned.py runs/compare-tuned-all/report/results.json
 CPU training here is deterministic, so a seed's SFT model
is the same in both when the SFT settings are: the script checks this first (the SFT model's
win rate must be identical per seed, else the pairing means nothing and it exits 1), then prints,
per task and method in both, the untuned and tuned mean win rate and KL over the common seeds and
tuned minus untuned paired by seed, with its 95% t-interval.
"""

from __future__ import annotations

import json
import sys

from rloo.experiments.compare.tables import mean_ci


def by_seed(files: list[dict]) -> dict:
    """{task: {method: {seed: run}}} merged over the files (a later file's run wins)."""
    out: dict = {}
    for data in files:
        for task, methods in data.items():
            for method, runs in methods.items():
                out.setdefault(task, {}).setdefault(method, {}).update({r["seed"]: r for r in runs})
    return out


def _ci(xs: list[float]) -> str:
    m, h = mean_ci(xs)
    return f"{m:+.3f}" + (f" ± {h:.3f}" if h is not None else "")


def split_untuned(data: dict) -> tuple[dict, dict]:
    """({task: {method: runs}} without the `<method>@untuned` runs, {task: {method: those runs}}),
    the SFT runs in both (the same cells: the pairing check then holds by construction)."""
    tuned = {t: {m: r for m, r in ms.items() if not m.endswith("@untuned")} for t, ms in data.items()}
    untuned = {
        t: {m.removesuffix("@untuned"): r for m, r in ms.items() if m.endswith("@untuned") or m == "sft"}
        for t, ms in data.items()
    }
    return tuned, untuned


def compare(tuned: dict, untuned: dict) -> tuple[list[str], bool]:
    lines, same_sft = [], True
    for task, methods in tuned.items():
        sft_t, sft_u = methods.get("sft", {}), untuned.get(task, {}).get("sft", {})
        seeds = sorted(set(sft_t) & set(sft_u))
        diff = [s for s in seeds if sft_t[s]["win_rate"] != sft_u[s]["win_rate"]]
        same_sft &= not diff
        lines.append(f"## {task}: SFT win rate identical on seeds {seeds}: {'yes' if not diff else f'NO {diff}'}")
        lines.append("| method | seeds | untuned win | tuned win | tuned - untuned (paired) | untuned KL | tuned KL |")
        lines.append("|---|---|---|---|---|---|---|")
        for method, runs in methods.items():
            old = untuned.get(task, {}).get(method, {})
            common = sorted(set(runs) & set(old))
            if method == "sft" or not common:
                continue
            u, t = [old[s]["win_rate"] for s in common], [runs[s]["win_rate"] for s in common]
            lines.append(
                f"| {method} | {len(common)} | {sum(u) / len(u):.3f} | {sum(t) / len(t):.3f} | "
                f"{_ci([b - a for a, b in zip(u, t, strict=True)])} | "
                f"{sum(old[s]['kl'] for s in common) / len(common):.2f} | "
                f"{sum(runs[s]['kl'] for s in common) / len(common):.2f} |"
            )
    return lines, same_sft


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    load = lambda p: json.load(open(p))  # noqa: E731
    if len(argv) == 1:
        lines, same_sft = compare(*split_untuned(by_seed([load(argv[0])])))
    else:
        lines, same_sft = compare(by_seed([load(argv[0])]), by_seed([load(p) for p in argv[1:]]))
    print("\n".join(lines))
    return 0 if same_sft else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
