"""How `rloo compare` judges a policy: one sample per prompt with fixed sampling noise per seed,
scored by the task's gold judge (and pass@k on a task scored by a checker)."""

from __future__ import annotations

import torch

from rloo.config import CompareConfig
from rloo.core.kl import sequence_kl
from rloo.eval.judge import win_rate
from rloo.eval.passk import evaluate_pass_at_k
from rloo.modeling.forward import completion_logprobs
from rloo.rollout import rollout
from rloo.rollout.decoding import logprob_temperature
from rloo.rollout.settings import decoding


@torch.no_grad()
def judge(policy, tokenizer, task, examples, cfg: CompareConfig, scorer=None, ref=None, seed: int = 0) -> dict:
    """One sample per held-out prompt (fixed sampling noise per seed): per-prompt gold scores and the
    means of gold, reward-model score, KL to the SFT model and length."""
    policy.eval()
    gen = torch.Generator().manual_seed(10_000 + seed)
    gold, rm, kl, length = [], [], [], []
    for i in range(0, len(examples), cfg.eval.batch_size):
        chunk = examples[i : i + cfg.eval.batch_size]
        roll = rollout(
            policy,
            tokenizer,
            [e.prompt for e in chunk],
            1,
            max_prompt_len=cfg.max_prompt_tokens,
            max_new_tokens=cfg.rl.max_new_tokens,
            generator=gen,
            **decoding(cfg.eval),
        )
        gold += [task.gold_score(e.prompt, c) for e, c in zip(chunk, roll.completions, strict=False)]
        length += roll.completion_mask.sum(-1).tolist()
        if scorer is not None:
            rm += scorer(roll).tolist()
        if ref is not None:
            ref_lp = completion_logprobs(
                ref,
                roll.prompt_ids,
                roll.prompt_mask,
                roll.completion_ids,
                roll.completion_mask,
                temperature=logprob_temperature(cfg.eval.temperature),
            )
            kl += sequence_kl(roll.logprobs, ref_lp, roll.completion_mask).tolist()
    refs = [task.gold_score(e.prompt, e.reference) for e in examples]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "gold_per_prompt": gold,
        "win_rate": win_rate(gold, refs),
        "gold": mean(gold),
        "reward": mean(rm),
        "kl": mean(kl),
        "length": mean(length),
    }


def pass_at_k(policy, tok, task, examples, cfg: CompareConfig, seed: int) -> dict:
    """pass@k of a policy on a checker task (the same sampling noise for every method of a seed)."""
    r = evaluate_pass_at_k(
        policy,
        tok,
        [e.prompt for e in examples],
        task.gold_score,
        n=cfg.eval.pass_samples,
        parse=getattr(task, "parse_answer", None),
        **decoding(cfg.eval),
        max_prompt_len=cfg.max_prompt_tokens,
        max_new_tokens=cfg.rl.max_new_tokens,
        batch_size=max(cfg.eval.batch_size, cfg.eval.pass_samples),
        generator=torch.Generator().manual_seed(20_000 + seed),
    )
    return {"pass": r.summary(), "pass_counts": r.counts}
