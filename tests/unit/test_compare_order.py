"""The paper's ordering in the compare report: verdicts from paired intervals, Spearman's rho and its
bootstrap over seeds, and the report section on a synthetic study (hand-derived numbers)."""

from __future__ import annotations

import json

import pytest

from rloo.config import CompareConfig
from rloo.experiments.compare.order import (
    PAPER_ORDER,
    correlation_table,
    ordering_table,
    paper_pairs,
    rank_correlation,
    ranks,
    spearman,
    verdict,
)
from rloo.experiments.compare.report import write_report

PAPER = [m for m, _ in PAPER_ORDER]


def test_verdict_reads_the_paired_interval():
    # mean 0.02, sd 0.01, n 3: half-width 4.303 * 0.01 / sqrt(3) = 0.0248 -> holds 0 (unresolved)
    assert verdict([0.01, 0.02, 0.03]) == "unresolved"
    assert verdict([0.04, 0.05, 0.06]) == "holds"  # 0.05 ± 0.0248
    assert verdict([-0.04, -0.05, -0.06]) == "reverses"
    assert verdict([0.5]) == "unresolved"  # one seed: no interval


def test_spearman_with_and_without_ties():
    assert ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # one swap of neighbours among 4: 1 - 6 * (1 + 1) / (4 * 15) = 0.8
    assert spearman([1, 2, 4, 3], [1, 2, 3, 4]) == pytest.approx(0.8)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_rank_correlation_bootstraps_over_the_common_seeds():
    paper = {"a": 3.0, "b": 2.0, "c": 1.0}
    # every seed orders a > b > c: every resample too, so rho = 1 with the interval [1, 1]
    same = {"a": {0: 0.9, 1: 0.8}, "b": {0: 0.5, 1: 0.6}, "c": {0: 0.1, 1: 0.2, 2: 0.3}}
    assert rank_correlation(same, paper) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0), [0, 1])
    # seed 0 orders c > b > a (rho -1), seed 1 a > b > c by more: the means
    # a: 0.55, b: 0.5, c: 0.45 -> rho +1; resamples of (0, 0) give -1: the interval spans both
    mixed = {"a": {0: 0.1, 1: 1.0}, "b": {0: 0.2, 1: 0.8}, "c": {0: 0.3, 1: 0.6}}
    rho, lo, hi, seeds = rank_correlation(mixed, paper)
    assert rho == pytest.approx(1.0) and lo == pytest.approx(-1.0) and hi == pytest.approx(1.0) and seeds == [0, 1]
    assert rank_correlation({"a": {0: 1.0}, "b": {0: 0.5}}, paper)[0] is None  # fewer than 3 methods


def test_paper_pairs_adds_the_update_view_in_its_methods_place():
    names = [*PAPER, "ppo@2x2", "grpo"]
    pairs = paper_pairs(names)
    assert pairs[:6] == list(zip(PAPER, PAPER[1:], strict=False))
    assert pairs[6:] == [("vanilla_pg", "ppo@2x2"), ("ppo@2x2", "dpo")]
    assert paper_pairs(["rloo", "ppo"]) == []  # not adjacent in the paper
    assert paper_pairs(["rloo", "rloo_k2", "rloo@untuned"]) == [("rloo", "rloo_k2")]  # untuned: not a view


def _run(seed, win, kls=(0.0, 1.0), wins=(0.4, 0.6), step_s=1.0):
    metrics = [{"step": 0, "eval/kl": kls[0], "eval/win_rate": wins[0]}]
    metrics += [{"step": 1, "time/update": step_s}, {"step": 1, "eval/kl": kls[1], "eval/win_rate": wins[1]}]
    return {"seed": seed, "win_rate": win, "metrics": metrics}


def _synthetic(seeds=(0, 1, 2)):
    """rloo > rloo_k2 by 0.10 on every seed (holds), raft > rloo_k2 by 0.05 (the pair reverses),
    the other methods below in the paper's order with seed noise."""
    final = {"rloo": 0.70, "rloo_k2": 0.60, "raft": 0.65, "reinforce": 0.55, "vanilla_pg": 0.50, "ppo": 0.45}
    final |= {"dpo": 0.40}
    return {
        name: [_run(s, w + 0.01 * s * (i % 2), wins=(0.4, w)) for s in seeds]
        for i, (name, w) in enumerate(final.items())
    }


def test_ordering_table_gives_each_pairs_difference_and_verdict():
    cfg = CompareConfig(methods=PAPER, tasks=["summarize"], seeds=[0, 1, 2], equal_kl=[0.5], equal_compute=[1.0])
    text = ordering_table(cfg, {"summarize": _synthetic()}, "summarize")
    row = lambda key: next(line for line in text.splitlines() if line.startswith(f"| {key}"))  # noqa: E731
    # rloo (noise 0) - rloo_k2 (+0.01 s): 0.10, 0.09, 0.08: mean 0.09, sd 0.01 -> ± 0.025, holds
    assert row("rloo > rloo_k2 (+3.7)").split(" | ")[1] == "+0.090 ± 0.025 holds (n=3)"
    # rloo_k2 (+0.01 s) - raft: -0.05, -0.04, -0.03 -> reverses; at KL 0.5, halfway along trajectories
    # from 0.4 at KL 0 to 0.60 and 0.65 at KL 1 (no seed noise there): -0.025 on every seed
    cells = row("rloo_k2 > raft (+1.0)").split(" | ")
    assert cells[1] == "-0.040 ± 0.025 reverses (n=3)"
    assert cells[2] == "-0.025 ± 0.000 reverses (n=3)"
    assert cells[3] == "-0.050 ± 0.000 reverses (n=3) |"  # 1 x rloo's time: every run at its last point


def test_the_report_has_the_ordering_and_the_rank_correlation(tmp_path):
    cfg = CompareConfig(methods=PAPER, tasks=["summarize"], seeds=[0, 1, 2], variance_batches=0)
    for name, runs in _synthetic().items():
        for r in runs:
            d = tmp_path / "runs" / "summarize" / f"seed-{r['seed']}" / name
            d.mkdir(parents=True)
            d.joinpath("result.json").write_text(
                json.dumps(
                    {"win_rate": r["win_rate"], "win_rate_vs_sft": 0.5, "kl": 1.0, "gold": 0.0, "reward": 0.0}
                    | {"length": 4.0, "samples": 6400, "seconds": 1.0}
                )
            )
            d.joinpath("metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in r["metrics"]))
    text = (write_report(cfg, tmp_path) / "report.md").read_text()
    assert "## The paper's ordering, pair by pair" in text
    assert "| rloo > rloo_k2 (+3.7) | +0.090 ± 0.025 holds (n=3) |" in text
    # the means order rloo, raft, rloo_k2, reinforce, vanilla_pg, ppo, dpo: one swap of neighbours
    # among 7 -> 1 - 6 * 2 / (7 * 48) = 0.964
    corr = correlation_table(cfg, {"summarize": _synthetic()}, "summarize")
    assert "| equal samples | +0.96 (" in corr and "; 3 seeds |" in corr
