"""The paper's ordering, tested: each adjacent pair of it, and its rank correlation, in the report.

The paper's TL;DR win rates (Ahmadian et al. 2024, as quoted in issue 33) order seven methods:
RLOO k=4 > RLOO k=2 > RAFT > REINFORCE > vanilla PG > PPO > DPO. For each adjacent pair (a, b) the
report gives a - b paired by seed (same SFT model, reward model and evaluation prompts) with its 95%
t-interval, and a verdict: holds (interval above 0), reverses (below 0) or unresolved; in each of
the report's views (final win rate at equal samples, at each equal-KL value, at each equal-compute
time). Then Spearman's rank correlation of the methods' mean win rates with the paper's order, with
a percentile bootstrap over seeds (all methods resampled together, so the pairing is kept).
"""

from __future__ import annotations

import math
import random
import re

from rloo.experiments.compare.kl import compute_points, compute_trajectory, trajectory, values_at
from rloo.experiments.compare.tables import mean_ci

PAPER_ORDER: tuple[tuple[str, float], ...] = (
    ("rloo", 77.9),
    ("rloo_k2", 74.2),
    ("raft", 73.2),
    ("reinforce", 70.7),
    ("vanilla_pg", 70.4),
    ("ppo", 67.6),
    ("dpo", 66.6),
)
"""The paper's TL;DR win rates (%), best first: the ordering the report tests."""

BOOTSTRAP_DRAWS = 2000


def verdict(diffs: list[float]) -> str:
    """'holds' when the 95% t-interval of the paired differences a - b (one per seed) lies above 0,
    'reverses' when below, 'unresolved' when it holds 0 or there are fewer than 2 seeds."""
    if len(diffs) < 2:
        return "unresolved"
    m, h = mean_ci(diffs)
    assert h is not None
    return "holds" if m - h > 0 else "reverses" if m + h < 0 else "unresolved"


def ranks(xs: list[float]) -> list[float]:
    """Ranks 1..n of xs (1 = smallest), ties given the mean of the ranks they span."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for p in order[i : j + 1]:
            out[p] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of ranks(xs) and ranks(ys) (n pairs; n >= 2); None when
    either has no spread (all tied). Without ties it is 1 - 6 sum d_i^2 / (n (n^2 - 1))."""
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def rank_correlation(
    values: dict[str, dict[int, float]], paper: dict[str, float], draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> tuple[float | None, float | None, float | None, list[int]]:
    """(rho, low, high, seeds): Spearman's rho between the methods' mean value over the seeds every
    ranked method has, and the paper's numbers; low/high the 2.5/97.5 percentiles of rho over
    `draws` resamples of those seeds with replacement (the same seeds for every method). values:
    {method: {seed: value}}; paper: {method: paper's number}. Ranked: the methods of `paper` with a
    value (rho None when fewer than 3)."""
    names = [n for n in paper if values.get(n)]  # a method with no value in this view is left out
    seeds = sorted(set.intersection(*(set(values[n]) for n in names))) if names else []
    if len(names) < 3 or not seeds:
        return None, None, None, seeds
    theirs = [paper[n] for n in names]

    def rho(sample: list[int]) -> float | None:
        return spearman([sum(values[n][s] for s in sample) / len(sample) for n in names], theirs)

    rng = random.Random(seed)
    boot = sorted(r for _ in range(draws) if (r := rho([rng.choice(seeds) for _ in seeds])) is not None)
    if len(seeds) < 2 or not boot:
        return rho(seeds), None, None, seeds
    return rho(seeds), boot[int(0.025 * (len(boot) - 1))], boot[int(0.975 * (len(boot) - 1))], seeds


def views(cfg, data: dict, task: str) -> list[tuple[str, dict[str, dict[int, float]]]]:
    """[(label, {run name: {seed: win rate}})] of each view: the final win rate (equal samples), the
    win rate at each cfg.equal_kl and at each equal-compute time (runs that never reach one left out)."""
    out = [("equal samples", {n: {r["seed"]: r["win_rate"] for r in rs} for n, rs in data[task].items() if n != "sft"})]
    xs, labels = compute_points(cfg, data, task)
    for traj, points, names in (
        (trajectory, list(cfg.equal_kl), [f"KL {k:g}" for k in cfg.equal_kl]),
        (compute_trajectory, xs, labels),
    ):
        at = values_at(data, task, traj, points)
        for i, label in enumerate(names):
            out.append((label, {n: {s: v[i] for s, v in by.items() if v[i] is not None} for n, by in at.items()}))
    return out


def paper_pairs(names: list[str]) -> list[tuple[str, str]]:
    """The adjacent pairs (better, worse) of the paper's order among `names`, then the same with each
    update view (ppo@2x2) in its method's place."""
    order = [m for m, _ in PAPER_ORDER]
    pairs = list(zip(order, order[1:], strict=False))
    for v in (n for n in names if re.fullmatch(r"[a-z0-9_]+@\d+x\d+", n) and n.split("@")[0] in order):
        m = v.split("@")[0]
        pairs += [(a if a != m else v, b if b != m else v) for a, b in pairs if m in (a, b) and "@" not in a + b]
    return [(a, b) for a, b in pairs if a in names and b in names]


def _pair_cell(values: dict[str, dict[int, float]], a: str, b: str) -> str:
    diffs = [v - values[b][s] for s, v in values.get(a, {}).items() if s in values.get(b, {})]
    if not diffs:
        return "-"
    m, h = mean_ci(diffs)
    return f"{m:+.3f} (n=1)" if h is None else f"{m:+.3f} ± {h:.3f} {verdict(diffs)} (n={len(diffs)})"


def ordering_table(cfg, data: dict, task: str) -> str:
    """Rows: the paper's adjacent pairs (paper_pairs); columns: the views; cells: better − worse in win
    rate paired by seed, mean ± 95% t-interval, the verdict and the number of seeds paired."""
    vs = views(cfg, data, task)
    pairs = paper_pairs([n for n in data[task] if n != "sft"])
    if not pairs:
        return "(none of the paper's adjacent pairs was run)"
    paper = dict(PAPER_ORDER)
    rows = [
        "| paper: better > worse (TL;DR points) | " + " | ".join(label for label, _ in vs) + " |",
        "|---" * (len(vs) + 1) + "|",
    ]
    for a, b in pairs:
        gap = paper[a.split("@")[0]] - paper[b.split("@")[0]]
        cells = [_pair_cell(values, a, b) for _, values in vs]
        rows.append(f"| {a} > {b} (+{gap:.1f}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def correlation_table(cfg, data: dict, task: str) -> str:
    """Per view: Spearman's rho of the mean win rates of the paper's methods with the paper's order,
    its bootstrap interval over seeds and the seeds used; again with each update view (ppo@2x2) in
    its method's place."""
    paper = dict(PAPER_ORDER)
    sets = [("the paper's methods", paper)]
    for v in (n for n in data[task] if re.fullmatch(r"[a-z0-9_]+@\d+x\d+", n) and n.split("@")[0] in paper):
        m = v.split("@")[0]
        sets.append((f"{v} for {m}", {(v if n == m else n): x for n, x in paper.items()}))
    rows = ["| view | " + " | ".join(f"rho, {name} (95% bootstrap; seeds)" for name, _ in sets) + " |"]
    rows.append("|---" * (len(sets) + 1) + "|")
    for label, values in views(cfg, data, task):
        cells = []
        for _, ref in sets:
            rho, lo, hi, seeds = rank_correlation(values, ref)
            left = [n for n in ref if not values.get(n)]
            cell = "-" if rho is None else f"{rho:+.2f}" + (f" ({lo:+.2f} to {hi:+.2f})" if lo is not None else "")
            cells.append(cell + f"; {len(seeds)} seeds" + (f"; without {', '.join(left)}" if left else ""))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
