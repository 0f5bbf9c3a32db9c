"""RLOO ablations, each named for what it changes; the paper's RLOO (`rloo_step`) stays the default.

- kl_estimator=k3: the shaped reward (eq. 1) sums k3 = (e^r - 1) - r per token instead of
  log(pi/pi_ref) (lower variance, still unbiased; Schulman 2020).
- kl_level=token: each token is charged only the KL of itself and later tokens
  (`leave_one_out_token_kl`); the score and the leave-one-out baseline stay whole-response.
- rloo_clip: PPO's ratio to the sampling policy and its clipping on top of the leave-one-out
  advantage (ppo_epochs x num_minibatches updates per batch). The sequence-level ratio is used
  with sequence-level KL, the token-level ratio with token-level KL.
- drop_zero_variance: groups whose k scores are all equal leave the update (with beta > 0 their
  leave-one-out advantages are not zero: they hold only the KL term, which dropping gives up).
"""

from __future__ import annotations

import torch

from rloo.algorithms.base import Models, StepResult
from rloo.algorithms.common import (
    Timer,
    clipped_updates,
    kept_rows,
    mean_stats,
    require_scored,
    rollout_stats,
    sample_and_score,
    sequence_rewards,
)
from rloo.config import RLConfig
from rloo.core.advantages import leave_one_out_token_kl, leave_one_out_valid, unscored
from rloo.core.kl import kl_per_token
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss, ppo_clip_loss, sequence_sum_policy_gradient_loss
from rloo.rollout.multiturn import policy_tokens


def is_plain_rloo(cfg: RLConfig) -> bool:
    a = cfg.algorithm_settings
    return a.kl_estimator == "k1" and a.kl_level == "sequence" and not a.rloo_clip and not a.drop_zero_variance


def _advantages(scores, roll, ref_lp, cfg: RLConfig):
    filled, valid = unscored(scores)
    rewards, kl = sequence_rewards(filled, roll, ref_lp, cfg)
    if cfg.algorithm_settings.kl_level == "token":
        require_scored(scores, "rloo with kl_level=token")
        kl_tokens = kl_per_token(roll.logprobs, ref_lp, cfg.algorithm_settings.kl_estimator)
        adv = leave_one_out_token_kl(scores, kl_tokens, policy_tokens(roll), cfg.beta, cfg.k)  # (N, T)
    else:
        adv = leave_one_out_valid(rewards.view(-1, cfg.k), valid.view(-1, cfg.k)).view(-1)  # (N,)
    return adv, rewards, kl


def _loss(lp, old_lp, adv, mask, cfg: RLConfig):
    token = adv.dim() == 2
    if cfg.algorithm_settings.rloo_clip:
        if token:
            return ppo_clip_loss(lp, old_lp, adv, mask, cfg.algorithm_settings.clip_eps)
        return ppo_clip_loss(
            sequence_logprobs(lp, mask), sequence_logprobs(old_lp, mask), adv, clip_eps=cfg.algorithm_settings.clip_eps
        )
    if token:
        return sequence_sum_policy_gradient_loss(lp, adv, mask)
    return policy_gradient_loss(sequence_logprobs(lp, mask), adv)


def rloo_ablation_step(models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    adv, rewards, kl = _advantages(scores, roll, ref_lp, cfg)
    rows, dropped = kept_rows(scores, cfg.k, cfg.algorithm_settings.drop_zero_variance)
    passes = (
        (cfg.algorithm_settings.ppo_epochs, cfg.algorithm_settings.num_minibatches)
        if cfg.algorithm_settings.rloo_clip
        else (1, 1)
    )

    mask = policy_tokens(roll)  # an episode's environment tokens are not the policy's: out of loss and KL

    def loss_fn(lp, r):
        return _loss(lp, roll.logprobs[r], adv[r], mask[r], cfg)

    # the token-level clipped loss averages over tokens; the others (eq. 5, sequence sums) over rows
    token_mean = adv.dim() == 2 and cfg.algorithm_settings.rloo_clip
    records, norm, skipped = clipped_updates(models, opt, roll, rows, loss_fn, cfg, gen, passes, token_mean=token_mean)
    timer.lap("update")
    stats = mean_stats(records) | {"groups/dropped": float(dropped)}
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, norm, skipped, timer), roll, rewards)
