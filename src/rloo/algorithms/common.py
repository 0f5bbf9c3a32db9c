"""Pieces the other online methods' steps share: sampling, scoring, minibatches, stats
(the guarded optimizer step and the step signature are in algorithms/base.py)."""

from __future__ import annotations

import time
from typing import Iterable, Iterator

import torch
from torch import Tensor

from rloo.config import RLConfig
from rloo.core.kl import shaped_reward
from rloo.algorithms.base import Models, score_rollout
from rloo.rollout import Rollout, rollout


class Timer:
    """Named wall-clock laps: `t.lap('rollout')` records the time since the previous lap."""

    def __init__(self):
        self.last, self.laps = time.perf_counter(), {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[f"time/{name}"] = self.laps.get(f"time/{name}", 0.0) + now - self.last
        self.last = now


def sample_and_score(models: Models, prompts: list[str], cfg: RLConfig, gen: torch.Generator, timer: Timer):
    """1-2 of every method: K completions per prompt, their scores (N,) and reference log-probs (N,T)."""
    roll = rollout(models.policy, models.tokenizer, prompts, cfg.k, max_prompt_len=cfg.max_prompt_tokens,
                   max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, generator=gen)
    timer.lap("rollout")
    scores, ref_lp = score_rollout(models, roll, cfg)
    timer.lap("score")
    return roll, scores, ref_lp


def sequence_rewards(scores: Tensor, roll: Rollout, ref_lp: Tensor, cfg: RLConfig) -> tuple[Tensor, Tensor]:
    """Eq. (1) with the configured KL estimator: (rewards (N,), kl (N,))."""
    estimator = cfg.algorithm_settings.kl_estimator
    rewards, kl = shaped_reward(scores, roll.logprobs, ref_lp, roll.completion_mask, cfg.beta, estimator)
    roll.record(score=scores, kl=kl)
    return rewards, kl


def minibatches(n: int, num_minibatches: int, epochs: int, gen: torch.Generator) -> Iterator[Tensor]:
    """Row indices for `epochs` reshuffled passes over n rows, each split in num_minibatches parts."""
    parts = min(num_minibatches, n)
    for _ in range(epochs):
        yield from torch.randperm(n, generator=gen).tensor_split(parts)


def mean_stats(records: Iterable[dict]) -> dict[str, float]:
    """Average each key over the minibatch records that have it."""
    acc: dict[str, list[float]] = {}
    for r in records:
        for k, v in r.items():
            acc.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def rollout_stats(roll: Rollout, scores: Tensor, kl: Tensor, rewards: Tensor, grad_norm: float,
                  skipped: bool, timer: Timer) -> dict[str, float]:
    """The metrics every method logs (names as in rloo_step, so curves line up across methods)."""
    lengths = roll.completion_mask.sum(-1).float()
    return {
        "reward/score": scores.mean().item(), "reward/kl": kl.mean().item(), "reward/total": rewards.mean().item(),
        "kl/ref": kl.mean().item(), "grad/norm": grad_norm, "gen/length": lengths.mean().item(),
        "gen/truncated": roll.truncated.float().mean().item(), "guard/skipped": float(skipped),
    } | timer.laps
