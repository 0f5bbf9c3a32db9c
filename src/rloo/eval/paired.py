"""Policy minus baseline on the same held-out prompts with the same sampling noise (paired).

The win rate is coarse: each prompt counts 0, 1/2 or 1. A weak or barely changed policy can have
the same outcome as its baseline on every prompt (on a tiny run both lose to almost every
reference), and then the normal-approximation interval of the paired differences has width zero,
"+0.0 (95% CI +0.0 to +0.0)", which reads as certainty. So the report says when that happens, and
gives the paired difference of the judge's scores, which moves before the win rate does.
"""

from __future__ import annotations

from rloo.eval.judge import PolicyEval, paired_difference


def compare_paired(policy: PolicyEval, baseline: PolicyEval) -> dict | None:
    """{win_rate, ci95, n, same_outcomes, score, score_ci95} (score keys only with per-prompt
    scores); None without a judge's wins. Half-widths: 1.96 x standard error of the paired mean."""
    if not policy.wins or not baseline.wins:
        return None
    diff, half = paired_difference(policy.wins, baseline.wins)
    out = {
        "win_rate": diff,
        "ci95": half,
        "n": len(policy.wins),
        "same_outcomes": sum(a == b for a, b in zip(policy.wins, baseline.wins, strict=False)),
    }
    if policy.scores and baseline.scores:
        out["score"], out["score_ci95"] = paired_difference(policy.scores, baseline.scores)
    return out


def describe(d: dict, judge: str) -> str:
    """The printed lines of a `compare_paired` result."""
    n = d["n"]
    lo, hi = 100 * (d["win_rate"] - d["ci95"]), 100 * (d["win_rate"] + d["ci95"])
    lines = [
        f"policy - baseline win rate: {100 * d['win_rate']:+.1f} points (95% CI {lo:+.1f} "
        f"to {hi:+.1f}, paired over {n} prompts, judged by {judge})"
    ]
    if d["same_outcomes"] == n:
        lines.append(
            f"  every prompt had the same win/tie/loss for both policies, so that interval has no width and "
            f"says little; at 0 of {n} prompts differing, the share that would differ is below "
            f"{100 * min(1.0, 3 / n):.1f}% (95%, rule of three)"
        )
    if "score" in d:
        lines.append(
            f"policy - baseline mean score ({judge}): {d['score']:+.3f} (95% CI {d['score'] - d['score_ci95']:+.3f} "
            f"to {d['score'] + d['score_ci95']:+.3f}, paired)"
        )
    return "\n".join(lines)
