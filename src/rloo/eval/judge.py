"""Evaluate a policy on held-out prompts: win rate against references by a judge, KL, length."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from rloo.core.kl import sequence_kl
from rloo.eval.sampling import sampled_chunks
from rloo.modeling.forward import completion_logprobs
from rloo.rollout.decoding import logprob_temperature


@dataclass
class PolicyEval:
    win_rate: float | None  # judge(policy) > judge(reference): 1, tie: 1/2
    gold: float | None  # mean judge score of the policy's responses (the judge named below)
    reward: float | None  # mean reward-model score
    kl: float | None  # mean sum_t log pi/pi_ref over the response (k1, on-policy samples)
    length: float  # mean completion tokens (EOS included)
    truncated: float  # fraction that hit the length limit
    samples: list[tuple[str, str]] = field(default_factory=list)  # (prompt, completion), first few
    wins: list[float] = field(default_factory=list, repr=False)  # per prompt: 1 win, 1/2 tie, 0 loss
    scores: list[float] = field(default_factory=list, repr=False)  # per prompt: the judge's score of the response
    judge: str | None = None  # who produced win_rate and gold: "gold judge (summarize)", "reward model", ...
    passk: object = field(default=None, repr=False)  # rloo.eval.passk.PassAtK (checker tasks)

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        d = {
            "win_rate": self.win_rate,
            "gold": self.gold,
            "reward": self.reward,
            "kl": self.kl,
            "length": self.length,
            "truncated": self.truncated,
        }
        return {prefix + k: v for k, v in d.items() if v is not None}

    def summary(self, samples: bool = False) -> dict:
        """The numbers for a summary.json (and the samples if asked): the judge's mean score under
        "gold" only when the judge is a task's gold judge, else under "judge_score" (a reward model's
        score is no gold result)."""
        drop = ("wins", "scores", "passk") + (() if samples else ("samples",))
        gold = (self.judge or "").startswith("gold judge")
        return {(k if k != "gold" or gold else "judge_score"): v for k, v in asdict(self).items() if k not in drop}


def wins(judge_policy: list[float], judge_reference: list[float], tol: float = 1e-9) -> list[float]:
    """Per prompt: 1 if the policy's response beats the reference, 1/2 for a tie, else 0."""
    return [
        1.0 if a > b + tol else 0.5 if abs(a - b) <= tol else 0.0
        for a, b in zip(judge_policy, judge_reference, strict=False)
    ]


def win_rate(judge_policy: list[float], judge_reference: list[float], tol: float = 1e-9) -> float:
    """Fraction of prompts where the policy's response beats the reference; ties count half."""
    w = wins(judge_policy, judge_reference, tol)
    return sum(w) / len(w)


def paired_difference(wins_a: list[float], wins_b: list[float]) -> tuple[float, float]:
    """Mean of wins_a - wins_b over the same prompts and its 95% half-width (normal approximation
    on the paired per-prompt differences)."""
    d = [a - b for a, b in zip(wins_a, wins_b, strict=False)]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(1, n - 1)
    return mean, 1.96 * (var / n) ** 0.5


@torch.no_grad()
def evaluate_policy(
    policy,
    tokenizer,
    prompts: list[str],
    *,
    references: list[str] | None = None,
    judge=None,
    reward_scorer=None,
    ref_model=None,
    temperature: float = 1.0,
    max_prompt_len: int = 64,
    max_new_tokens: int = 32,
    batch_size: int = 128,
    generator: torch.Generator | None = None,
    keep_samples: int = 4,
    all_done=None,
    **shaping,
) -> PolicyEval:
    """One sampled response per prompt, judged against `references` with `judge(prompt, response)`.
    `all_done`: the shared stop of processes whose forward passes are collectives (FSDP; see `sample`).
    `shaping`: rollout's top_p, top_k, min_new_tokens, repetition_penalty, stop (rloo.rollout.settings.decoding);
    temperature 0 is greedy, its KL to the reference taken at temperature 1 (`logprob_temperature`)."""
    gold, refs_gold, rm, kls, lengths, truncs, samples = [], [], [], [], [], [], []
    chunks = sampled_chunks(
        policy,
        tokenizer,
        prompts,
        1,
        batch_size=batch_size,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        generator=generator,
        all_done=all_done,
        **shaping,
    )
    for i, (chunk, roll) in zip(range(0, len(prompts), batch_size), chunks, strict=True):
        lengths += roll.completion_mask.sum(-1).tolist()
        truncs += roll.truncated.float().tolist()
        if judge is not None:
            gold += _judge_samples(judge, roll)
            if references is not None:
                refs_gold += _judge_texts(judge, chunk, references[i : i + batch_size])
        if reward_scorer is not None:
            rm += reward_scorer(roll).tolist()
        if ref_model is not None:
            ref_lp = completion_logprobs(
                ref_model,
                roll.prompt_ids,
                roll.prompt_mask,
                roll.completion_ids,
                roll.completion_mask,
                temperature=logprob_temperature(temperature),
            )
            kls += sequence_kl(roll.logprobs, ref_lp, roll.completion_mask).tolist()
        samples += list(zip(chunk, roll.completions, strict=False))[: max(0, keep_samples - len(samples))]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return PolicyEval(
        win_rate=win_rate(gold, refs_gold) if refs_gold else None,
        gold=mean(gold),
        reward=mean(rm),
        kl=mean(kls),
        length=mean(lengths),
        truncated=mean(truncs),
        samples=samples,
        wins=wins(gold, refs_gold) if refs_gold else [],
        scores=list(gold),
        judge=None if judge is None else getattr(judge, "name", getattr(judge, "__name__", "judge")),
    )


def _judge_samples(judge, roll) -> list[float]:
    """Scores of sampled responses: as training scored them when the judge can (rloo.rewards.judges)."""
    if hasattr(judge, "score"):
        return judge.score(roll)
    return [judge(p, c) for p, c in zip(roll.prompts, roll.completions, strict=False)]


def _judge_texts(judge, prompts: list[str], texts: list[str]) -> list[float]:
    if hasattr(judge, "score_texts"):
        return judge.score_texts(prompts, texts)
    return [judge(p, t) for p, t in zip(prompts, texts, strict=False)]
