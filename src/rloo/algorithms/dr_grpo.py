"""Dr. GRPO: GRPO done right (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
Perspective", sec. 3.2). Two changes to GRPO, each removing a bias of its normalizations:

  1. sample K completions per prompt and score them (the raw score: the KL is in the loss)
  2. A_i = score_i - mean of its group, the same on every token: no division by the group std,
     which up-weights prompts that are almost always or almost never solved (`group_mean_advantages`)
  3. ppo_epochs x num_minibatches steps on the clipped surrogate + beta * k3 KL, each completion's
     token terms summed and divided by one constant (algo.norm_length, default max_new_tokens)
     instead of the completion's own length, which favoured long wrong answers (`dr_grpo_loss`)
Scores of None (a reward function's "could not score") are left out of the group mean and get 0;
with algo.drop_zero_variance, groups whose scores are all equal are left out of the update.
Samples of an older policy (rl.max_staleness, rl.is_correction): decoupled, docs/async.md eq. A3.
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
from rloo.core.advantages import group_mean_advantages, unscored
from rloo.core.losses import dr_grpo_loss


def dr_grpo_step(models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    filled, valid = unscored(scores)
    old, weights, is_stats = proximal(models, roll, cfg)
    rewards, kl = sequence_rewards(filled, roll, ref_lp, cfg, old)  # logged only: the KL is in the loss
    advantages = group_mean_advantages(filled.view(-1, cfg.k), valid.view(-1, cfg.k)).view(-1)
    rows, dropped = kept_rows(scores, cfg.k, cfg.algorithm_settings.drop_zero_variance)
    norm_length = cfg.algorithm_settings.norm_length or cfg.max_new_tokens

    def loss_fn(lp, r):
        mask = roll.completion_mask[r]
        w = None if weights is None else weights[r]
        eps = cfg.algorithm_settings.clip_eps
        return dr_grpo_loss(lp, old[r], ref_lp[r], advantages[r], mask, eps, cfg.beta, norm_length, w)

    # the loss divides by rows x norm_length: micro-batches weigh by their rows
    records, norm, skipped = clipped_updates(models, opt, roll, rows, loss_fn, cfg, gen, token_mean=False)
    timer.lap("update")
    stats = mean_stats(records) | {"groups/dropped": float(dropped)} | floats(is_stats)
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, norm, skipped, timer), roll, rewards)
