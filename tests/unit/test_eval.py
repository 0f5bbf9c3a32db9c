"""Win rate, ties and the paired difference used in reports; preference pairs from policy samples."""

from __future__ import annotations

import pytest

from rloo.config import Sampling
from rloo.data.preferences import preference_pairs
from rloo.eval.judge import paired_difference, win_rate, wins
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


def test_reward_model_judge_scores_samples_as_training_does(tiny_model_dir):
    """With a reward model on the policy's tokenizer, the eval's judge score of the sampled responses
    equals the reward-model score (the one training optimises: the sampled token ids), not a score of
    the decoded, stripped and re-tokenized text, which gave other numbers for the same samples."""
    import torch

    from rloo.eval.judge import evaluate_policy
    from rloo.modeling.loading import frozen, load_policy, load_reward_model
    from rloo.rewards import RewardModelScorer
    from rloo.rewards.judges import make_judge
    from rloo.rollout import rollout
    from rloo.tasks import get_task

    policy, tok = load_policy(str(tiny_model_dir))
    rm, rm_tok = load_reward_model(str(tiny_model_dir))
    scorer = RewardModelScorer(frozen(rm), rm_tok, policy_tokenizer=tok)
    assert scorer.same_tokenizer
    judge = make_judge("reward_model", reward_scorer=scorer, reward_name="reward model (tiny)")
    ex = get_task("summarize").examples("eval", 12, seed=0)
    prompts, refs = [e.prompt for e in ex], [e.reference for e in ex]
    # max_new_tokens=3: most samples are cut without EOS, where the text path appends one
    roll = rollout(policy, tok, prompts, 1, Sampling(3, 64), generator=torch.Generator().manual_seed(0))
    assert judge.score(roll) == scorer(roll).tolist()
    text_path = scorer.score_texts(roll.prompts, roll.completions).tolist()
    assert text_path != scorer(roll).tolist(), "the old path (re-tokenized text) scores these samples differently"
    res = evaluate_policy(
        policy,
        tok,
        prompts,
        Sampling(3, 64),
        references=refs,
        judge=judge,
        reward_scorer=scorer,
        generator=torch.Generator().manual_seed(0),
    )
    assert res.judge == "reward model (tiny)"
    assert res.gold == res.reward  # the same scores, averaged in the same order


def test_paired_report_says_when_the_win_rate_cannot_separate():
    """Same outcome on every prompt: the win-rate interval has no width, and the report says so and
    gives the paired score difference. Hand-derived: score differences [1, 0, 1, 0] have mean 0.5,
    sample variance 1/3, standard error sqrt(1/3 / 4) = 0.2887, half-width 1.96 x 0.2887 = 0.566."""
    from rloo.eval.judge import PolicyEval
    from rloo.eval.paired import compare_paired, describe

    def ev(wins, scores):
        return PolicyEval(
            win_rate=sum(wins) / len(wins),
            gold=sum(scores) / len(scores),
            reward=None,
            kl=None,
            length=1.0,
            truncated=0.0,
            wins=wins,
            scores=scores,
            judge="j",
        )

    d = compare_paired(ev([0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 3.0, 0.0]), ev([0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0]))
    assert d["win_rate"] == 0.0 and d["ci95"] == 0.0 and d["same_outcomes"] == 4
    assert abs(d["score"] - 0.5) < 1e-12 and abs(d["score_ci95"] - 1.96 * (1 / 12) ** 0.5) < 1e-12
    text = describe(d, "j")
    assert "+0.0 points (95% CI +0.0 to +0.0" in text and "same win/tie/loss" in text and "below 75.0%" in text
    assert "mean score (j): +0.500 (95% CI -0.066 to +1.066, paired)" in text
    d = compare_paired(ev([1.0, 0.0, 1.0, 0.5], [1.0] * 4), ev([0.0, 0.0, 1.0, 0.5], [0.0] * 4))
    assert d["same_outcomes"] == 3 and "same win/tie/loss" not in describe(d, "j")
