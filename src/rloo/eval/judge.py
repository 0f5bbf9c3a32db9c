"""Evaluate a policy on held-out prompts: win rate against references by a judge, KL, length.

KL in the report: eq. 1's k1 estimator, sum_t log pi(y_t)/pi_ref(y_t), is unbiased for KL(pi || pi_ref)
but each sample (and a small mean) can be negative; greedy responses (temperature 0) are not samples
of pi at all, and their k1 went negative in practice. The report's KL is therefore k3
(Schulman 2020), summed over the response's tokens: with r_t = log pi_ref(y_t|.) - log pi(y_t|.),

    k3_t = exp(r_t) - 1 - r_t >= 0          (e^r >= 1 + r for every real r; 0 only at r = 0)
    E_{y_t ~ pi}[exp(r_t)] = sum_v pi(v) pi_ref(v)/pi(v) = 1   (pi_ref sums to 1 over pi's support)
    => E[k3_t | y_<t] = 1 - 1 + E[-r_t | y_<t] = KL(pi(.|y_<t) || pi_ref(.|y_<t))

and by the chain rule E[sum_t k3_t] = KL(pi(y|x) || pi_ref(y|x)): unbiased for sampled responses,
never negative for any response. For greedy responses it is a non-negative distance along the greedy
path, not KL(pi || pi_ref) (no estimator from one point per prompt is); the report says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from rloo.config import Sampling
from rloo.core.kl import sequence_kl
from rloo.eval.sampling import sampled_chunks
from rloo.modeling.forward import completion_logprobs
from rloo.rewards.judges import Judge
from rloo.rollout.decoding import logprob_temperature
from rloo.runtime.inputs.user_code import callable_name


@dataclass
class PolicyEval:
    win_rate: float | None  # judge(policy) > judge(reference): 1, tie: 1/2
    gold: float | None  # mean judge score of the policy's responses (the judge named below)
    reward: float | None  # mean reward-model score
    kl: float | None  # mean sum_t log pi/pi_ref over the response (k1, on-policy samples)
    length: float | None  # mean completion tokens (EOS included); None without prompts
    truncated: float | None  # fraction that hit the length limit; None without prompts
    samples: list[tuple[str, str]] = field(default_factory=list)  # (prompt, completion), first few
    kl_k3: float | None = None  # mean sum_t k3_t over the response (>= 0; the module docstring)
    wins: list[float] = field(default_factory=list, repr=False)  # per prompt: 1 win, 1/2 tie, 0 loss
    scores: list[float] = field(default_factory=list, repr=False)  # per prompt: the judge's score of the response
    judge: str | None = None  # who produced win_rate and gold: "gold judge (summarize)", "reward model", ...
    judge_kind: str | None = None  # rloo.rewards.judges.Judge.kind: gold, reward_model, function
    per_prompt: dict[str, list] = field(default_factory=dict, repr=False)  # PER_PROMPT's lists, one entry a prompt
    passk: object = field(default=None, repr=False)  # rloo.eval.passk.PassAtK (checker tasks)

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The metrics.jsonl record; the judge's mean score is named by its kind (`score_key`)."""
        d = {
            "win_rate": self.win_rate,
            score_key(self.judge_kind): self.gold,
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
        drop = ("wins", "scores", "passk", "per_prompt") + (() if samples else ("samples",))
        gold = self.judge_kind == "gold" or (self.judge or "").startswith("gold judge")
        return {(k if k != "gold" or gold else "judge_score"): v for k, v in asdict(self).items() if k not in drop}


# The per-prompt lists `evaluate_policy` keeps (PolicyEval.per_prompt): what eval/samples.jsonl holds
PER_PROMPT = ("completion", "score", "reference_score", "reward", "kl", "kl_k3", "length", "truncated")


def judge_kind(judge) -> str:
    """A `Judge`'s kind (gold, reward_model, function); a plain function given to the API: function."""
    return judge.kind if isinstance(judge, Judge) else "function"


def judge_name(judge) -> str:
    """A `Judge`'s name; a plain function given to the API: its __name__ (a callable object may have none)."""
    return judge.name if isinstance(judge, Judge) else callable_name(judge, "judge")


def score_key(kind: str | None) -> str:
    """The metric name of a judge's mean score: `gold` only for a built-in task's gold judge, else
    `judge_<kind>` (`judge_reward_model`, `judge_function`): a reward model's score is no gold result."""
    return "gold" if kind == "gold" else f"judge_{kind or 'function'}"


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
    s: Sampling,
    *,
    references: list[str] | None = None,
    judge=None,
    reward_scorer=None,
    ref_model=None,
    batch_size: int = 128,
    generator: torch.Generator | None = None,
    keep_samples: int = 4,
    all_done=None,
) -> PolicyEval:
    """One sampled response per prompt, judged against `references` with `judge(prompt, response)`.
    `all_done`: the shared stop of processes whose forward passes are collectives (FSDP; see
    `sample_tokens`). `s`: how to sample (an eval section's `sampling`); temperature 0 is greedy, its
    KL to the reference taken at temperature 1 (`logprob_temperature`)."""
    rows: dict[str, list] = {k: [] for k in PER_PROMPT}
    samples: list[tuple[str, str]] = []
    chunks = sampled_chunks(
        policy, tokenizer, prompts, 1, s, batch_size=batch_size, generator=generator, all_done=all_done
    )
    for i, (chunk, roll) in zip(range(0, len(prompts), batch_size), chunks, strict=True):
        refs = None if references is None else references[i : i + batch_size]
        _judged_chunk(rows, chunk, roll, judge, refs, reward_scorer, ref_model, s.temperature)
        samples += list(zip(chunk, roll.completions, strict=False))[: max(0, keep_samples - len(samples))]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    gold, refs_gold = rows["score"], rows["reference_score"]
    return PolicyEval(
        win_rate=win_rate(gold, refs_gold) if refs_gold else None,
        gold=mean(gold),
        reward=mean(rows["reward"]),
        kl=mean(rows["kl"]),
        length=mean(rows["length"]),
        truncated=mean(rows["truncated"]),
        samples=samples,
        kl_k3=mean(rows["kl_k3"]),
        wins=wins(gold, refs_gold) if refs_gold else [],
        scores=list(gold),
        judge=None if judge is None else judge_name(judge),
        judge_kind=None if judge is None else judge_kind(judge),
        per_prompt=rows,
    )


def _judged_chunk(rows: dict[str, list], chunk, roll, judge, refs, reward_scorer, ref_model, temperature) -> None:
    """Append one chunk's per-prompt values to `rows` (PER_PROMPT's lists; a list stays empty when
    its source, a judge, references, a reward model or a reference model, is absent)."""
    rows["completion"] += roll.completions
    rows["length"] += roll.completion_mask.sum(-1).tolist()
    rows["truncated"] += roll.truncated.float().tolist()
    if judge is not None:
        rows["score"] += _judge_samples(judge, roll)
        if refs is not None:
            rows["reference_score"] += _judge_texts(judge, chunk, refs)
    if reward_scorer is not None:
        rows["reward"] += reward_scorer(roll).tolist()
    if ref_model is not None:
        ref_lp = completion_logprobs(
            ref_model,
            roll.prompt_ids,
            roll.prompt_mask,
            roll.completion_ids,
            roll.completion_mask,
            temperature=logprob_temperature(temperature),
        )
        rows["kl"] += sequence_kl(roll.logprobs, ref_lp, roll.completion_mask).tolist()
        rows["kl_k3"] += sequence_kl(roll.logprobs, ref_lp, roll.completion_mask, "k3").tolist()


def _judge_samples(judge, roll) -> list[float]:
    """Scores of sampled responses: as training scored them when the judge can (rloo.rewards.judges)."""
    if hasattr(judge, "score"):
        return judge.score(roll)
    return [judge(p, c) for p, c in zip(roll.prompts, roll.completions, strict=False)]


def _judge_texts(judge, prompts: list[str], texts: list[str]) -> list[float]:
    if hasattr(judge, "score_texts"):
        return judge.score_texts(prompts, texts)
    return [judge(p, t) for p, t in zip(prompts, texts, strict=False)]
