"""Win rate, ties and the paired difference used in reports; preference pairs from policy samples."""

from __future__ import annotations

import pytest

from rloo.eval.judge import paired_difference, win_rate, wins
from rloo.data.preferences import preference_pairs
from rloo.tasks import get_task


def test_wins_and_ties():
    # 0.9 > 0.5: win; 0.5 == 0.5: tie (1/2); 0.1 < 0.3: loss -> (1 + 0.5 + 0) / 3
    assert wins([0.9, 0.5, 0.1], [0.5, 0.5, 0.3]) == [1.0, 0.5, 0.0]
    assert win_rate([0.9, 0.5, 0.1], [0.5, 0.5, 0.3]) == pytest.approx(0.5)


def test_paired_difference_by_hand():
    # d = [1, 0.5, 0, 0.5]: mean 0.5; sample var = (0.25 + 0 + 0.25 + 0) / 3 = 1/6; half = 1.96 sqrt(1/24)
    mean, half = paired_difference([1, 1, 0.5, 0.5], [0, 0.5, 0.5, 0])
    assert mean == pytest.approx(0.5)
    assert half == pytest.approx(1.96 * (1 / 24) ** 0.5)


def test_preference_pairs_mix_policy_samples_and_references():
    task = get_task("summarize")
    calls = []

    def sampler(prompts):
        calls.append(len(prompts))
        return ["zzz-policy"] * len(prompts)

    pairs = preference_pairs(task, 40, seed=0, sampler=sampler, policy_share=0.25)
    assert calls == [20]  # 10 prompts x 2 samples, one batched call
    from_policy = [p for p in pairs if p[1] == "zzz-policy" and p[2] == "zzz-policy"]
    assert len(from_policy) == 10
    assert len(pairs) == 40
    # without a sampler every pair compares two references
    assert not any("zzz-policy" in (c, r) for _, c, r in preference_pairs(task, 40, seed=0))
