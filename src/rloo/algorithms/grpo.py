"""GRPO: group-relative policy optimization (Shao et al. 2024, DeepSeekMath sec. 4.1).

1. sample K completions per prompt and score them (the raw score: the KL is in the loss)
2. A_i = (score_i - mean of its group) / std of its group, the same on every token
   (a group whose scores are all equal gets zeros, not NaN; None scores are left out and get 0)
3. ppo_epochs x num_minibatches steps on the clipped surrogate + beta * k3 KL to the reference
Samples of an older policy (rl.max_staleness, rl.is_correction): decoupled, docs/async.md eq. A3 (the
ratio to the step's starting weights, every token's terms times the weight of those to the sampler's).
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
from rloo.core.advantages import group_normalized, group_normalized_valid, unscored
from rloo.core.losses import grpo_loss
from rloo.rollout.multiturn import policy_tokens


def grpo_step(models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    filled, valid = unscored(scores)
    old, weights, is_stats = proximal(models, roll, cfg)
    rewards, kl = sequence_rewards(filled, roll, ref_lp, cfg, old)  # logged only: GRPO's KL is in the loss
    grouped, valid_g = filled.view(-1, cfg.k), valid.view(-1, cfg.k)
    advantages = (group_normalized(grouped) if valid.all() else group_normalized_valid(grouped, valid_g)).view(-1)
    roll.record(advantage=advantages)
    settings = cfg.algorithm_settings
    rows, dropped = kept_rows(scores, cfg.k, settings.drop_zero_variance)
    mask = policy_tokens(roll)  # an episode's environment tokens are not the policy's: out of both means

    def loss_fn(lp, r):
        w = None if weights is None else weights[r]
        return grpo_loss(lp, old[r], ref_lp[r], advantages[r], mask[r], cfg.algorithm_settings.clip_eps, cfg.beta, w)

    # the loss averages over the minibatch's policy tokens: micro-batches weigh by theirs
    records, norm, skipped = clipped_updates(models, opt, roll, rows, loss_fn, cfg, gen, token_mean=True)
    timer.lap("update")
    stats = mean_stats(records) | {"adv/std": advantages.std().item(), "groups/dropped": float(dropped)}
    stats |= floats(is_stats)
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, norm, skipped, timer), roll, rewards)
