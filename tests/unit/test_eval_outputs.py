"""What an evaluation keeps and how it labels it: every judged sample (samples.jsonl rows), the
report's best / worst / most changed examples, the judge's metric named by its kind, the note when
the judge is the reward RL optimised, the report's KL estimator (k3: never negative, unbiased), the
judge-score plot, and episodes printed with the environment's text marked."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rloo.core.kl import sequence_kl
from rloo.eval.judge import PER_PROMPT, PolicyEval, score_key
from rloo.eval.samples import chosen_examples, examples_markdown, sample_rows
from rloo.rewards.judges import Judge, make_judge
from rloo.tasks import get_task


def _ev(scores, kls, kind="reward_model"):
    n = len(scores)
    per = {k: [] for k in PER_PROMPT}
    per |= {"completion": [f"c{i}" for i in range(n)], "score": scores, "kl": kls, "kl_k3": [abs(k) for k in kls]}
    per |= {"length": [3.0] * n, "truncated": [0.0, 1.0] * (n // 2)}
    return PolicyEval(None, sum(scores) / n, None, None, 3.0, 0.5, judge="j", judge_kind=kind, per_prompt=per)


def test_sample_rows_and_the_examples_chosen_by_the_paired_difference():
    # policy - baseline per prompt: [+2, -3, 0, +1]; best = prompts 0, 3, 2; worst = 1, 2, 3;
    # most changed = the policy's largest k3: prompts 2 (0.9), 0 (0.5), 1 (0.2)
    pol, base = _ev([3.0, 0.0, 1.0, 2.0], [0.5, -0.2, 0.9, 0.1]), _ev([1.0, 3.0, 1.0, 1.0], [0.0] * 4)
    prompts = [f"p{i}" for i in range(4)]
    rows = sample_rows(prompts, ["r0", None, "r2", "r3"], {"policy": pol, "baseline": base})
    assert [r["score_difference"] for r in rows] == [2.0, -3.0, 0.0, 1.0]
    assert rows[1]["reference"] is None and rows[0]["policy"]["completion"] == "c0"
    assert rows[1]["policy"]["truncated"] is True and rows[0]["policy"]["length"] == 3
    assert rows[1]["policy"]["kl"] == -0.2 and rows[1]["policy"]["kl_k3"] == 0.2
    json.dumps(rows)  # every value is JSON
    chosen = chosen_examples(rows, n=3)
    assert [[r["prompt"] for r in chosen[k]] for k in ("best", "worst", "most changed")] == [
        ["p0", "p3", "p2"],
        ["p1", "p2", "p3"],
        ["p2", "p0", "p1"],
    ]
    text = examples_markdown(chosen, "j")
    assert "## Best examples (largest policy - baseline score difference; judge: j)" in text
    assert "## Worst examples" in text and "## Most changed examples" in text
    assert "policy - baseline: -3.000" in text


def test_examples_without_a_baseline_rank_by_the_policy_score_and_fence_backticks():
    pol = _ev([0.0, 5.0], [0.1, 0.2])
    pol.per_prompt["completion"] = ["a ``` b", "c"]
    rows = sample_rows(["x", "y"], ["r", "s"], {"policy": pol})
    assert "score_difference" not in rows[0]
    chosen = chosen_examples(rows, n=1)
    assert chosen["best"][0]["prompt"] == "y" and chosen["worst"][0]["prompt"] == "x"
    text = examples_markdown(chosen, "j")
    assert "(the policy's score; judge: j)" in text
    assert "````text\na ``` b\n````" in text  # a fence longer than the text's backtick run


def test_the_judge_metric_is_named_by_what_judged():
    """`eval/gold` only for a task's gold judge; a reward model's or a function's score is
    `eval/judge_reward_model` / `eval/judge_function` (it was `eval/gold` for every judge)."""
    assert score_key("gold") == "gold" and score_key("reward_model") == "judge_reward_model"
    assert "eval/judge_reward_model" in _ev([1.0, 2.0], [0.0, 0.0]).as_metrics()
    assert "eval/gold" not in _ev([1.0, 2.0], [0.0, 0.0]).as_metrics()
    assert "eval/gold" in _ev([1.0, 2.0], [0.0, 0.0], kind="gold").as_metrics()
    assert make_judge(None, task=get_task("summarize")).kind == "gold"
    scorer = type("Scorer", (), {"score_texts": lambda self, p, c: [0.0] * len(p), "__call__": lambda self, r: []})()
    assert make_judge("reward_model", reward_scorer=scorer).kind == "reward_model"
    summary = _ev([1.0, 2.0], [0.0, 0.0]).summary()
    assert "judge_score" in summary and "gold" not in summary and "per_prompt" not in summary


def test_the_report_says_when_the_judge_is_the_optimised_reward(tmp_path):
    from rloo.training.eval_notes import judge_note, optimised_sources

    rm = tmp_path / "reward" / "model"
    rm.mkdir(parents=True)
    (tmp_path / "rl" / "model").mkdir(parents=True)
    (tmp_path / "rl" / "config.yaml").write_text(f"# precision line\nreward_model: {rm}\nreward_fn: [f.py:g]\n")
    optimised = optimised_sources(str(tmp_path / "rl" / "model"))
    assert optimised == {str(rm.resolve()), "f.py:g"}
    rm_judge = Judge("reward model (x)", lambda p, c: [0.0], kind="reward_model")
    assert "not an independent judge" in judge_note(rm_judge, str(rm), optimised)
    assert "not an independent judge" in judge_note(Judge("f.py:g", lambda p, c: [0.0]), None, optimised)
    other = judge_note(rm_judge, str(tmp_path / "elsewhere"), optimised)
    assert "RL optimised" not in other and "not a gold judge" in other
    assert "independent" in judge_note(make_judge("gold", task=get_task("summarize")), None, optimised)
    assert optimised_sources(str(tmp_path / "nowhere" / "model")) == set()


def test_k3_is_never_negative_and_unbiased_for_the_sequence_kl():
    """k3 summed over a sampled sequence estimates KL(pi || ref) without bias and is >= 0 per sample,
    where k1 has negative samples. Two-token sequences over 3 symbols with position-dependent
    distributions (independent positions, so the exact sequence KL is the sum of the per-position KLs).
    The test bounds the mean's error by 5 standard errors of the sample (a statistical claim)."""
    g = torch.Generator().manual_seed(0)
    pi = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]], dtype=torch.float64)
    ref = torch.tensor([[0.3, 0.4, 0.3], [0.25, 0.25, 0.5]], dtype=torch.float64)
    exact = float((pi * (pi / ref).log()).sum())
    n = 200_000
    ys = torch.stack([torch.multinomial(pi[t], n, replacement=True, generator=g) for t in range(2)], dim=1)
    lp = torch.stack([pi[t].log()[ys[:, t]] for t in range(2)], dim=1)
    ref_lp = torch.stack([ref[t].log()[ys[:, t]] for t in range(2)], dim=1)
    mask = torch.ones(n, 2, dtype=torch.bool)
    k3, k1 = sequence_kl(lp, ref_lp, mask, "k3"), sequence_kl(lp, ref_lp, mask, "k1")
    assert bool((k3 >= 0).all()) and bool((k1 < 0).any())
    for est in (k3, k1):
        se = float(est.std()) / math.sqrt(n)
        assert abs(float(est.mean()) - exact) < 5 * se, (float(est.mean()), exact, se)


def test_the_judge_score_is_plotted(tmp_path):
    """win_rate.png is flat at 0 when every response scores below its reference; judge_score.png plots the
    score, under whichever name the judge's kind gave it."""
    from rloo.eval.plots import plot_training

    recs = [{"step": s, "eval/win_rate": 0.0, "eval/judge_reward_model": -2.0 + 0.1 * s} for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    written = plot_training(tmp_path / "metrics.jsonl", tmp_path / "plots", judge="reward model (rm)")
    assert {p.name for p in written} == {"win_rate.png", "judge_score.png"}


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ([True, True, False, False, True], "ans 3 [env: out 7] 4"),
        ([False, True, True, True, True], "[env: ans] 3 out 7 4"),
    ],
)
def test_episodes_mark_the_environment_text(policy, expected):
    from rloo.eval.episodes import marked_text
    from rloo.tasks.tokenizer import build_tokenizer

    tok = build_tokenizer(get_task("calculator"))
    ids = tok("ans 3 out 7 4", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5
    assert marked_text(tok, ids, policy) == expected
