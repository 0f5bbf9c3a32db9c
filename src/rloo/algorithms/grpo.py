"""GRPO: group-relative policy optimization (Shao et al. 2024, DeepSeekMath sec. 4.1).

  1. sample K completions per prompt and score them (the raw score: the KL is in the loss)
  2. A_i = (score_i - mean of its group) / std of its group, the same on every token
     (a group whose scores are all equal gets zeros, not NaN)
  3. ppo_epochs x num_minibatches steps on the clipped surrogate + beta * k3 KL to the reference
"""

from __future__ import annotations

import torch

from rloo.algorithms.base import Models, guarded_step
from rloo.algorithms.common import (Timer, mean_stats, minibatches, rollout_stats, sample_and_score,
                                    sequence_rewards)
from rloo.config import RLConfig
from rloo.core.advantages import group_normalized
from rloo.core.losses import grpo_loss
from rloo.modeling.forward import completion_logprobs


def grpo_step(models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    rewards, kl = sequence_rewards(scores, roll, ref_lp, cfg)   # logged only: GRPO's KL is in the loss
    advantages = group_normalized(scores.view(-1, cfg.k)).view(-1)
    roll.record(advantage=advantages)
    old_lp, records, norms, skipped = roll.logprobs, [], [], False
    params = list(models.policy.parameters())
    s = cfg.algorithm_settings
    for rows in minibatches(len(roll.prompts), s.num_minibatches, s.ppo_epochs, gen):
        mask = roll.completion_mask[rows]
        lp = completion_logprobs(models.policy, roll.prompt_ids[rows], roll.prompt_mask[rows],
                                 roll.completion_ids[rows], mask, temperature=cfg.temperature,
                                 max_logits_mb=cfg.max_logits_mb)
        loss, stats = grpo_loss(lp, old_lp[rows], ref_lp[rows], advantages[rows], mask, s.clip_eps, cfg.beta)
        norm, stepped = guarded_step(loss, params, opt, cfg.max_grad_norm)
        records.append(stats)
        norms.append(norm)
        skipped |= not stepped
    timer.lap("update")
    stats = mean_stats(records) | {"adv/std": advantages.std().item()}
    return stats | rollout_stats(roll, scores, kl, rewards, max(norms), skipped, timer), roll, rewards
