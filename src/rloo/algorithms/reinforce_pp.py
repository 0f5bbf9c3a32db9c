"""REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models"; OpenRLHF's `advantage_estimator=reinforce`): REINFORCE with PPO's clipping and no critic,
whose baseline and scale come from the whole batch rather than from each prompt's group.

  1. sample K completions per prompt, score them, per-token KL to the reference
  2. G_{i,t} = score_i - beta * sum_{s >= t} kl_{i,s}  (the KL as a per-token reward, reward-to-go)
  3. A_{i,t} = (G_{i,t} - mean G) / std G over every real token of the batch (`reinforce_pp_advantages`)
  4. ppo_epochs x num_minibatches steps on the clipped surrogate, token mean (`ppo_clip_loss`)
Scores of None are left out of the batch statistics and get 0; with algo.drop_zero_variance, groups
whose scores are all equal are left out of the statistics and of the update.
Samples of an older policy (rl.max_staleness, rl.is_correction): the KL of the current policy in
G (eq. A1), the batch statistics over the behaviour samples, decoupled clipping (docs/async.md eq. A3).
"""

from __future__ import annotations

import torch

from rloo.algorithms.base import Models, StepResult
from rloo.algorithms.common import (
    Timer,
    clipped_updates,
    kept_rows,
    mean_stats,
    rollout_stats,
    sample_and_score,
    sequence_rewards,
)
from rloo.algorithms.offpolicy import floats, proximal
from rloo.config import RLConfig
from rloo.core.advantages import reinforce_pp_advantages, unscored
from rloo.core.kl import kl_per_token
from rloo.core.losses import ppo_clip_loss, weigh


def reinforce_pp_step(models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    filled, valid = unscored(scores)
    old, weights, is_stats = proximal(models, roll, cfg)  # old: the sampler's log-probs on-policy
    rewards, kl = sequence_rewards(filled, roll, ref_lp, cfg, old)
    rows, dropped = kept_rows(scores, cfg.k, cfg.algorithm_settings.drop_zero_variance)
    in_update = torch.zeros_like(valid)
    in_update[rows] = True
    kl_tokens = kl_per_token(old, ref_lp, cfg.algorithm_settings.kl_estimator)
    advantages = weigh(
        reinforce_pp_advantages(filled, kl_tokens, roll.completion_mask, cfg.beta, valid & in_update), weights
    )

    def loss_fn(lp, r):
        return ppo_clip_loss(lp, old[r], advantages[r], roll.completion_mask[r], cfg.algorithm_settings.clip_eps)

    # ppo_clip_loss averages over the minibatch's tokens: micro-batches weigh by theirs
    records, norm, skipped = clipped_updates(models, opt, roll, rows, loss_fn, cfg, gen, token_mean=True)
    timer.lap("update")
    stats = mean_stats(records) | {"groups/dropped": float(dropped)} | floats(is_stats)
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, norm, skipped, timer), roll, rewards)
