"""Pieces every online method's step shares: sampling, scoring, minibatches, stats (the update's
log-probs, the guarded optimizer step, the step signature and its result are in algorithms/base.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from rloo.algorithms.agents import sample_episodes
from rloo.algorithms.base import (
    Accumulated,
    Models,
    guarded_step,
    rows_logprobs,
    score_rollout,
    update_logprobs,
)
from rloo.config import METHOD_SPECS, RLConfig
from rloo.config.methods import capable, one_of
from rloo.core.accumulation import micro_batches, micro_shares
from rloo.core.advantages import unscored, zero_variance_groups
from rloo.core.kl import shaped_reward
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss
from rloo.errors import EnvError, RewardError
from rloo.rollout import Rollout, rollout
from rloo.rollout.capabilities import EpisodeRollout
from rloo.rollout.multiturn import policy_tokens
from rloo.runtime.distributed import is_wrapped, unwrap


class Timer:
    """Named wall-clock laps: `t.lap('rollout')` records the time since the previous lap."""

    def __init__(self):
        self.last, self.laps = time.perf_counter(), {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[f"time/{name}"] = self.laps.get(f"time/{name}", 0.0) + now - self.last
        self.last = now


def sample_rollout(
    models: Models,
    prompts: list[str],
    cfg: RLConfig,
    gen: torch.Generator,
    rows=None,
    all_done=None,
    keep_prefill: bool = False,
):
    """Step 1 of every online method: K completions per prompt with the sampled tokens' log-probs,
    from the configured sampler (generation=vllm) or rloo's own rollout. keep_prefill: keep the
    graph-carrying prompt pass for the update to reuse (rloo_step's fast path; see `rollout`)."""
    if models.env is not None:  # multi-turn episodes: the update counts the policy's tokens only (policy_tokens)
        if not METHOD_SPECS[cfg.algorithm].multi_turn:
            multi = one_of(capable("multi_turn"))
            raise EnvError(
                f"algorithm={cfg.algorithm} does not train on multi-turn environments; use algorithm={multi}"
            )
        return sample_episodes(models, prompts, cfg, gen, rows)
    if models.sampler is not None:  # the run's generator seeds vLLM's requests (exact resume)
        return models.sampler(unwrap(models.policy), prompts, rows=rows, generator=gen)
    return rollout(
        unwrap(models.policy),
        models.tokenizer,
        prompts,
        cfg.k,
        cfg.sampling,
        generator=gen,
        keep_prefill=keep_prefill,
        rows=rows,
        all_done=all_done,
        captured=cfg.captured_decode,
    )


def keeps_prefill(models: Models, cfg: RLConfig, n_prompts: int) -> bool:
    """Should sampling keep the graph-carrying prompt pass for the update (`update_logprobs`) to reuse:
    with share_prompt, unless the policy is DDP/FSDP-wrapped (its update must be one forward through
    the wrapper) or the update runs in micro-batches (which recompute their own prompts)."""
    return cfg.share_prompt and not is_wrapped(models.policy) and not splits(cfg, n_prompts)


def splits(cfg: RLConfig, n_prompts: int) -> bool:
    """Does rl.micro_batch_size split an update over n_prompts prompts in several passes."""
    return cfg.micro_batch_size is not None and cfg.micro_batch_size < n_prompts


def micro_parts(rows: Tensor, cfg: RLConfig, per_prompt: int | None = None) -> list[Tensor]:
    """An update's rows (n,) in micro-batches of rl.micro_batch_size prompts' rows (x k, or
    x per_prompt); [rows] when it does not split them (rloo.core.accumulation.micro_batches)."""
    size = cfg.micro_batch_size
    return micro_batches(rows, None if size is None else size * (per_prompt or cfg.k))


def policy_gradient_update(models: Models, roll, mask: Tensor, advantages: Tensor, cfg: RLConfig):
    """Eq. 5's loss over every row with its stats: one pass (`update_logprobs`, reusing the sampling's
    prompt pass) or, when rl.micro_batch_size splits the batch, an `Accumulated` of micro-batches of
    whole groups (row shares; its own stats, filled by the step, join these). mask (N, T): the tokens
    that count (the policy's)."""
    parts = micro_parts(torch.arange(mask.shape[0], device=mask.device), cfg)
    if len(parts) == 1:
        logprobs = update_logprobs(models, roll, cfg)
        return policy_gradient_loss(sequence_logprobs(logprobs, mask), advantages)
    wrapped = is_wrapped(models.policy)

    def loss_of(r: Tensor):
        lp = rows_logprobs(models.policy, roll, r, cfg, wrapped)
        return policy_gradient_loss(sequence_logprobs(lp, mask[r]), advantages[r])

    whole = {"adv/mean": advantages.mean(), "adv/std": advantages.std(correction=0)}  # not share-weighted
    return Accumulated(parts, micro_shares(parts), loss_of, models.policy), whole


def step_loss_stats(loss, stats: dict) -> dict[str, float]:
    """The loss's stats as floats, after the step: an Accumulated's weighted ones under `stats`."""
    own = loss.stats if isinstance(loss, Accumulated) else {}
    return {k: float(v) for k, v in (own | stats).items()}


def sample_and_score(
    models: Models, prompts: list[str], cfg: RLConfig, gen: torch.Generator, timer: Timer, keep_prefill: bool = False
):
    """1-2 of every method: K completions per prompt, their scores (N,) and reference log-probs (N,T).
    keep_prefill: as for rloo_step (`sample`), for a method whose update is
    rloo's one pass over every row in order (`update_logprobs`)."""
    roll = sample_rollout(models, prompts, cfg, gen, keep_prefill=keep_prefill)  # generation=vllm or rloo's sampler
    timer.lap("rollout")
    scores, ref_lp = score_rollout(models, roll, cfg)
    timer.lap("score")
    return roll, scores, ref_lp


def sequence_rewards(
    scores: Tensor, roll: Rollout, ref_lp: Tensor, cfg: RLConfig, logprobs: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Eq. (1) with the configured KL estimator, summed over the policy's tokens: (rewards (N,), kl (N,)).
    logprobs (N,T): the policy's whose KL it is, by default the sampler's (eq. A1 passes the current ones)."""
    estimator = cfg.algorithm_settings.kl_estimator
    lp = roll.logprobs if logprobs is None else logprobs
    rewards, kl = shaped_reward(scores, lp, ref_lp, policy_tokens(roll), cfg.beta, estimator)
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
    *,
    token_mean: bool,
):
    """epochs x minibatches guarded steps over the given rows (the kept ones); passes = (epochs,
    minibatches), by default (ppo_epochs, num_minibatches). loss_fn(logprobs (n, T), rows (n,)) ->
    (loss, stats). Returns (records, max grad norm, skipped). No rows (every group dropped): no
    step, and nothing is counted as skipped. rl.micro_batch_size splits each minibatch; token_mean:
    loss_fn averages over the minibatch's policy tokens (micro-batch shares by them), else over its rows."""
    records, norms, skipped = [], [0.0], False
    params = list(models.policy.parameters())
    if rows.numel() == 0:
        return records, 0.0, False
    epochs, parts = passes or (cfg.algorithm_settings.ppo_epochs, cfg.algorithm_settings.num_minibatches)
    wrapped = is_wrapped(models.policy)
    for part in minibatches(rows.numel(), parts, epochs, gen):
        r = rows[part]
        micro = micro_parts(r, cfg)
        if len(micro) == 1:
            loss, stats = loss_fn(rows_logprobs(models.policy, roll, r, cfg, wrapped), r)
        else:
            shares = micro_shares(micro, policy_tokens(roll) if token_mean else None)
            loss = Accumulated(
                micro, shares, lambda m: loss_fn(rows_logprobs(models.policy, roll, m, cfg, wrapped), m), models.policy
            )
        norm, stepped = guarded_step(loss, params, opt, cfg.max_grad_norm)
        records.append(loss.stats if isinstance(loss, Accumulated) else stats)
        norms.append(norm)
        skipped |= not stepped
    return records, max(norms), skipped


def rollout_stats(
    roll: Rollout, scores: Tensor, kl: Tensor, rewards: Tensor, grad_norm: float, skipped: bool, timer: Timer
) -> dict[str, float]:
    """The metrics every method logs (rloo_step's, so curves line up across methods) and its phase times."""
    return step_stats(roll, scores, kl, rewards, grad_norm, not skipped, roll.group_size) | timer.laps


def step_stats(roll: Rollout, scores, kl, rewards, grad_norm: float, finite: bool, k: int) -> dict[str, float]:
    """The logged numbers of one step besides the loss's own and the phase times. Of the scores (N,)
    (a None score is NaN): reward/unscored, the share of None scores; groups/zero_variance, the share
    of prompts whose k scored scores are all equal (no group baseline draws a gradient from them);
    reward/score, the mean of the scored ones (0 when none was). Lengths count the policy's tokens (a
    multi-turn episode's tool output is not the policy's), and an episode's rollout adds its
    environment's stats."""
    filled, valid = unscored(scores)
    groups = {"reward/unscored": 1.0 - valid.float().mean().item()}
    if k > 1:
        groups["groups/zero_variance"] = (
            zero_variance_groups(scores.view(-1, k), valid.view(-1, k)).float().mean().item()
        )
    lengths = policy_tokens(roll).sum(-1).float()
    return (
        groups
        | (roll.env_stats if isinstance(roll, EpisodeRollout) else {})
        | {
            "reward/score": (filled.sum() / valid.sum().clamp(min=1)).item(),
            "reward/kl": kl.mean().item(),
            "reward/total": rewards.mean().item(),
            "kl/ref": kl.mean().item(),
            "grad/norm": grad_norm,
            "gen/length": lengths.mean().item(),
            "gen/truncated": roll.truncated.float().mean().item(),
            "guard/skipped": float(not finite),
            "data/prompts_truncated": float(roll.prompts_truncated),
        }
    )
