"""RLOO ablations, each named for what it changes; the paper's RLOO (`rloo_step`) stays the default.

- kl_estimator=k3: the shaped reward (eq. 1) sums k3 = (e^r - 1) - r per token instead of
  log(pi/pi_ref) (lower variance, still unbiased; Schulman 2020).
- kl_level=token: each token is charged only the KL of itself and later tokens
  (`leave_one_out_token_kl`); the score and the leave-one-out baseline stay whole-response.
- rloo_clip: PPO's ratio to the sampling policy and its clipping on top of the leave-one-out
  advantage (ppo_epochs x num_minibatches updates per batch). The sequence-level ratio is used
  with sequence-level KL, the token-level ratio with token-level KL.
"""

from __future__ import annotations

import torch

from rloo.algorithms.base import Models, guarded_step
from rloo.algorithms.common import (Timer, mean_stats, minibatches, rollout_stats, sample_and_score,
                                    sequence_rewards)
from rloo.config import RLConfig
from rloo.core.advantages import leave_one_out, leave_one_out_token_kl
from rloo.core.kl import kl_per_token
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss, ppo_clip_loss, sequence_sum_policy_gradient_loss
from rloo.modeling.forward import completion_logprobs


def is_plain_rloo(cfg: RLConfig) -> bool:
    a = cfg.algorithm_settings
    return a.kl_estimator == "k1" and a.kl_level == "sequence" and not a.rloo_clip


def _advantages(scores, roll, ref_lp, cfg: RLConfig):
    rewards, kl = sequence_rewards(scores, roll, ref_lp, cfg)
    if cfg.algorithm_settings.kl_level == "token":
        kl_tokens = kl_per_token(roll.logprobs, ref_lp, cfg.algorithm_settings.kl_estimator)
        adv = leave_one_out_token_kl(scores, kl_tokens, roll.completion_mask, cfg.beta, cfg.k)   # (N, T)
    else:
        adv = leave_one_out(rewards.view(-1, cfg.k)).view(-1)                                    # (N,)
    return adv, rewards, kl


def _loss(lp, old_lp, adv, mask, cfg: RLConfig):
    token = adv.dim() == 2
    if cfg.algorithm_settings.rloo_clip:
        if token:
            return ppo_clip_loss(lp, old_lp, adv, mask, cfg.algorithm_settings.clip_eps)
        return ppo_clip_loss(sequence_logprobs(lp, mask), sequence_logprobs(old_lp, mask), adv,
                             clip_eps=cfg.algorithm_settings.clip_eps)
    if token:
        return sequence_sum_policy_gradient_loss(lp, adv, mask)
    return policy_gradient_loss(sequence_logprobs(lp, mask), adv)


def rloo_ablation_step(models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    adv, rewards, kl = _advantages(scores, roll, ref_lp, cfg)
    s = cfg.algorithm_settings
    epochs, parts = (s.ppo_epochs, s.num_minibatches) if s.rloo_clip else (1, 1)
    records, norms, skipped = [], [], False
    params = list(models.policy.parameters())
    for rows in minibatches(len(roll.prompts), parts, epochs, gen):
        mask = roll.completion_mask[rows]
        lp = completion_logprobs(models.policy, roll.prompt_ids[rows], roll.prompt_mask[rows],
                                 roll.completion_ids[rows], mask, temperature=cfg.temperature,
                                 max_logits_mb=cfg.max_logits_mb)
        loss, stats = _loss(lp, roll.logprobs[rows], adv[rows], mask, cfg)
        norm, stepped = guarded_step(loss, params, opt, cfg.max_grad_norm)
        records.append(stats)
        norms.append(norm)
        skipped |= not stepped
    timer.lap("update")
    return mean_stats(records) | rollout_stats(roll, scores, kl, rewards, max(norms), skipped, timer), roll, rewards
