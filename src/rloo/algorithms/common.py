"""Pieces the other online methods' steps share: sampling, scoring, minibatches, stats
(the guarded optimizer step and the step signature are in algorithms/base.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from rloo.algorithms.base import Models, guarded_step, rows_logprobs, score_rollout
from rloo.algorithms.rloo import sample, step_stats
from rloo.config import METHOD_SPECS, RLConfig
from rloo.config.methods import one_of
from rloo.core.advantages import unscored, zero_variance_groups
from rloo.core.kl import shaped_reward
from rloo.errors import RewardError
from rloo.rollout import Rollout
from rloo.runtime.distributed import is_wrapped


class Timer:
    """Named wall-clock laps: `t.lap('rollout')` records the time since the previous lap."""

    def __init__(self):
        self.last, self.laps = time.perf_counter(), {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[f"time/{name}"] = self.laps.get(f"time/{name}", 0.0) + now - self.last
        self.last = now


def sample_and_score(
    models: Models, prompts: list[str], cfg: RLConfig, gen: torch.Generator, timer: Timer, keep_prefill: bool = False
):
    """1-2 of every method: K completions per prompt, their scores (N,) and reference log-probs (N,T).
    keep_prefill: as for rloo_step (`rloo.algorithms.rloo.sample`), for a method whose update is
    rloo's one pass over every row in order (`update_logprobs`)."""
    roll = sample(models, prompts, cfg, gen, keep_prefill=keep_prefill)  # generation=vllm or rloo's sampler
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


def require_scored(scores: Tensor, algorithm: str) -> None:
    """Methods without a group baseline have no rule for a reward function's None: stop clearly."""
    if torch.isnan(scores).any():
        tolerant = [n for n, spec in METHOD_SPECS.items() if spec.unscored]
        raise RewardError(
            f"the reward function could not score {int(torch.isnan(scores).sum())} completion(s) "
            f"(returned None); {algorithm} has no rule for that: use {one_of(tolerant)}, which leave "
            f"unscored samples out of the baseline"
        )


def kept_rows(scores: Tensor, k: int, drop: bool) -> tuple[Tensor, int]:
    """Rows that enter the update, and how many groups were dropped: every row, or (drop=True)
    the rows of groups whose scores are not all equal (``zero_variance_groups``)."""
    n = scores.shape[0]
    if not drop or k < 2:
        return torch.arange(n, device=scores.device), 0
    _, valid = unscored(scores)
    flat = zero_variance_groups(scores.view(-1, k), valid.view(-1, k))
    keep = (~flat).repeat_interleave(k)
    return keep.nonzero().squeeze(-1), int(flat.sum())


def clipped_updates(
    models: Models,
    opt,
    roll: Rollout,
    rows: Tensor,
    loss_fn,
    cfg: RLConfig,
    gen: torch.Generator,
    passes: tuple[int, int] | None = None,
):
    """epochs x minibatches guarded steps over the given rows (the kept ones); passes = (epochs,
    minibatches), by default (ppo_epochs, num_minibatches). loss_fn(logprobs (n, T), rows (n,)) ->
    (loss, stats). Returns (records, max grad norm, skipped). No rows (every group dropped): no
    step, and nothing is counted as skipped."""
    records, norms, skipped = [], [0.0], False
    params = list(models.policy.parameters())
    if rows.numel() == 0:
        return records, 0.0, False
    epochs, parts = passes or (cfg.algorithm_settings.ppo_epochs, cfg.algorithm_settings.num_minibatches)
    wrapped = is_wrapped(models.policy)
    for part in minibatches(rows.numel(), parts, epochs, gen):
        r = rows[part]
        lp = rows_logprobs(models.policy, roll, r, cfg, wrapped)
        loss, stats = loss_fn(lp, r)
        norm, stepped = guarded_step(loss, params, opt, cfg.max_grad_norm)
        records.append(stats)
        norms.append(norm)
        skipped |= not stepped
    return records, max(norms), skipped


def rollout_stats(
    roll: Rollout, scores: Tensor, kl: Tensor, rewards: Tensor, grad_norm: float, skipped: bool, timer: Timer
) -> dict[str, float]:
    """The metrics every method logs (rloo_step's, so curves line up across methods) and its phase times."""
    return step_stats(roll, scores, kl, rewards, grad_norm, not skipped, roll.group_size) | timer.laps
