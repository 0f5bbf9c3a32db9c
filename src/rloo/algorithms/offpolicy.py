"""Steps 3-4 of `rloo_step` when the samples come from a behaviour policy mu other than the policy
pi being trained (rl.max_staleness > 0, or rl.is_correction at N = 0 for a sampler whose log-probs
differ from the trainer's). docs/async.md derives it:

  eq. A1  R_i = r(x, y_i) - beta * sum_t (log pi(y_it|.) - log pi_ref(y_it|.))   KL of the CURRENT pi
  eq. 4   A_i = R_i - 1/(k-1) sum_{j != i} R_j                                  (unchanged)
  eq. A2  loss = -1/N sum_i w_i A_i log pi(y_i|x),  w_i = tis/mis of pi(y_i|x)/mu(y_i|x), detached
          (token-level variants: -1/N sum_i A_i sum_t w_it log pi(y_it|.))
"""

from __future__ import annotations

import torch

from rloo.config import RLConfig
from rloo.core.advantages import leave_one_out, leave_one_out_valid
from rloo.core.importance import importance_weights, weighted_policy_gradient_loss
from rloo.core.kl import shaped_reward
from rloo.rollout import Rollout


def loo_advantages(rewards: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 4 on (N,) rewards in groups of k; a None score (valid False) gets 0 and leaves the baselines."""
    grouped = rewards.view(-1, k)
    advantages = leave_one_out(grouped) if valid.all() else leave_one_out_valid(grouped, valid.view(-1, k))
    return advantages.view(-1)


def off_policy_loss(logprobs: torch.Tensor, roll: Rollout, filled, valid, ref_lp, cfg: RLConfig):
    """Eq. A1, 4, A2. logprobs (N,T): the current policy's, with the graph; roll.logprobs: the
    behaviour policy's (sampling time). Returns (loss, stats, rewards (N,), kl (N,), advantages (N,))."""
    correction = cfg.off_policy_correction
    assert correction is not None, "off_policy_loss needs rl.max_staleness > 0 or rl.is_correction"
    mask = roll.completion_mask
    # eq. A1: the KL penalty of the policy being trained, not of the one that sampled (docs/async.md)
    rewards, kl = shaped_reward(filled, logprobs.detach(), ref_lp, mask, cfg.beta)
    advantages = loo_advantages(rewards, valid, cfg.k)
    weights, is_stats = importance_weights(logprobs, roll.logprobs, mask, correction, cfg.is_clip)
    loss, stats = weighted_policy_gradient_loss(logprobs, mask, advantages, weights)
    return loss, stats | is_stats | {"is/lag": torch.tensor(float(roll.lag))}, rewards, kl, advantages
