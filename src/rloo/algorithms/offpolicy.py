"""The update of each online method when its samples come from a behaviour policy mu other than the
policy pi being trained (rl.max_staleness > 0, or rl.is_correction at N = 0 for a sampler whose
log-probs differ from the trainer's). docs/async.md derives it; its equations:

  eq. A1  R_i = r(x, y_i) - beta * sum_t (log pi(y_it|.) - log pi_ref(y_it|.))   KL of the CURRENT pi
  eq. 4   A_i = R_i - 1/(k-1) sum_{j != i} R_j                                  (rloo; unchanged)
  eq. A2  loss = -1/N sum_i w_i A_i log pi(y_i|x),  w_i = tis/mis of pi(y_i|x)/mu(y_i|x), detached
          (token-level variants: -1/N sum_i A_i sum_t w_it log pi(y_it|.))       rloo, reinforce
  eq. B1-B4  rl.is_correction asymre, topr, cispo, clipped_surrogate: rloo's eq. A2 rewritten by the
          bounded estimators of rloo.core.bounded (docs/async.md, "Bounded estimators")  rloo
  eq. A4  rl.is_kl=unweighted: A_i = A^r_i + A^kl_i (eq. 4 on the scores, on -beta KL_i), and only
          A^r is weighted: loss = -1/N sum_i (w_i A^r_i + A^kl_i) log pi(y_i|x)   rloo
  eq. A3  l_it -> w_it * l_it(pi / pi_prox): each token's term of the method's loss (its clipped
          surrogate, or the plain one, and an in-loss KL) with the ratio to the proximal policy
          pi_prox (the weights at the start of the step) and the detached weight w of pi_prox / mu,
          w_it = w_i (sequence corrections) or w_it (token ones)   vanilla_pg, ppo, grpo, dr_grpo, reinforce_pp
"""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.algorithms.base import Models, rollout_logprobs
from rloo.config import RLConfig
from rloo.config.method_settings import ClipSettings
from rloo.core.advantages import leave_one_out
from rloo.core.bounded import BOUNDED, bounded_loss
from rloo.core.importance import importance_weights, kl_outside_loss, weighted_policy_gradient_loss
from rloo.core.kl import shaped_reward
from rloo.rollout import Rollout

Stats = dict[str, Tensor]


def _correction(cfg: RLConfig) -> str:
    correction = cfg.off_policy_correction
    assert correction is not None, "the off-policy update needs rl.max_staleness > 0 or rl.is_correction"
    return correction


def _bounded_settings(cfg: RLConfig) -> dict:
    """rloo.core.bounded's hyperparameters, all read here: C (is_clip), cispo's c_low, asymre's delta and
    clipped_surrogate's clip range (the method's clip_eps setting, rloo's: the on-policy rloo_clip's;
    0.2, that setting's default, for a method without one)."""
    a = cfg.algorithm_settings
    eps = a.clip_eps if isinstance(a, ClipSettings) else ClipSettings().clip_eps
    return dict(clip=cfg.is_clip, clip_low=cfg.is_clip_low, shift=cfg.is_baseline_shift, clip_eps=eps)


def lag_stats(roll: Rollout) -> Stats:
    """is/lag: updates between the weights that sampled the batch and the trained ones."""
    return {"is/lag": torch.tensor(float(roll.lag))}


def current_rewards(logprobs: Tensor, filled: Tensor, ref_lp: Tensor, mask: Tensor, cfg: RLConfig, estimator="k1"):
    """Eq. A1: the shaped reward with the KL of the policy being trained, not of the one that sampled.
    logprobs (N,T) the current policy's (detached here). -> (rewards (N,), kl (N,))."""
    return shaped_reward(filled, logprobs.detach(), ref_lp, mask, cfg.beta, estimator)


def weighted_loss(
    logprobs: Tensor,
    roll: Rollout,
    advantages: Tensor,
    cfg: RLConfig,
    kl_advantages: Tensor | None = None,
    rewards: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """Eq. A2 with the weights of rl.is_correction: logprobs (N,T) the current policy's, with the graph;
    roll.logprobs the behaviour policy's; advantages (N,); with kl_advantages (N,) the KL's share of
    them goes outside the weights (eq. A4, rl.is_kl=unweighted); rewards (N,) eq. A1's, where topr splits
    on them (rl.is_topr_split=reward, the TOPR paper's rule). -> (loss, stats with is/*)."""
    mask, correction = roll.completion_mask, _correction(cfg)
    if correction in BOUNDED:  # rloo's sequence-level estimators (rloo.core.bounded), is_kl=weighted only
        hp = _bounded_settings(cfg)
        # topr's split on the rewards (the paper's rule): the config allows is_topr_split=reward with topr only
        split_on = rewards if cfg.is_topr_split == "reward" else None
        assert split_on is not None or cfg.is_topr_split == "advantage", "is_topr_split=reward needs the rewards"
        loss, stats = bounded_loss(logprobs, roll.logprobs, mask, advantages, correction, **hp, split_on=split_on)
        return loss, stats | lag_stats(roll)
    weights, is_stats = importance_weights(logprobs, roll.logprobs, mask, correction, cfg.is_clip)
    if kl_advantages is None:
        loss, stats = weighted_policy_gradient_loss(logprobs, mask, advantages, weights)
    else:
        loss, stats = kl_outside_loss(logprobs, mask, advantages - kl_advantages, kl_advantages, weights)
    return loss, stats | is_stats | lag_stats(roll)


def off_policy_loss(
    logprobs: Tensor, roll: Rollout, valid: Tensor, rewards: Tensor, kl: Tensor, advantages: Tensor, cfg: RLConfig
):
    """rloo's step 4 for samples of another policy: eq. A2 given eq. A1's rewards (N,) and kl (N,) and
    eq. 4's advantages (N,) (rloo_step computes them); with rl.is_kl=unweighted the KL's share stays
    outside the weights (eq. A4). logprobs (N,T): the current policy's, with the graph; roll.logprobs:
    the behaviour policy's (sampling time); valid (N,): the scored rows. Returns (loss, stats)."""
    # eq. A4: the KL's leave-one-out share, A^kl = eq. 4 on -beta KL (eq. 4 is linear in R)
    unweighted = cfg.is_kl == "unweighted"
    groups = valid.view(-1, cfg.k)
    kl_advantages = leave_one_out((-cfg.beta * kl).view(-1, cfg.k), groups).view(-1) if unweighted else None
    return weighted_loss(logprobs, roll, advantages, cfg, kl_advantages, rewards)


def proximal_logprobs(models: Models, roll: Rollout, cfg: RLConfig) -> Tensor:
    """log pi_prox (N,T) of the rollout's tokens: the policy at the start of the step, no graph
    (eq. A3's proximal policy; 0 on padding)."""
    with torch.no_grad():
        lp = rollout_logprobs(models.policy, roll, cfg)
    return torch.where(roll.completion_mask, lp, torch.zeros_like(lp))


def token_weights(proximal: Tensor, roll: Rollout, cfg: RLConfig) -> tuple[Tensor, Stats]:
    """Eq. A3's detached weights (N,T) of pi_prox / mu under rl.is_correction, a sequence weight
    repeated on its tokens, 0 on padding; and the is/* stats (is/weight_mean over sequences or tokens)."""
    mask = roll.completion_mask
    weights, stats = importance_weights(proximal, roll.logprobs, mask, _correction(cfg), cfg.is_clip)
    mean = weights.mean() if weights.dim() == 1 else weights[mask].mean() if mask.any() else weights.sum()
    if weights.dim() == 1:
        weights = weights[:, None].expand_as(mask)
    weights = torch.where(mask, weights, torch.zeros_like(weights))
    return weights, stats | lag_stats(roll) | {"is/weight_mean": mean}


def proximal(models: Models, roll: Rollout, cfg: RLConfig) -> tuple[Tensor, Tensor | None, Stats]:
    """What a ratio method's loss divides by and weighs with: on-policy (no correction) the sampler's
    log-probs, no weights, no stats (the method's update as it was); else eq. A3's log pi_prox (N,T),
    the weights (N,T) of pi_prox / mu and the is/* stats."""
    if cfg.off_policy_correction is None:
        return roll.logprobs, None, {}
    prox = proximal_logprobs(models, roll, cfg)
    weights, stats = token_weights(prox, roll, cfg)
    return prox, weights, stats


def as_sampled_stats(logprobs: Tensor, roll: Rollout, rows: Tensor, cfg: RLConfig) -> Stats:
    """The is/* stats of rows (n,) trained on as sampled, weight 1 (raft; docs/async.md): the ratio
    pi / mu of their log-probs (n,T) under the current policy, a diagnostic only."""
    mask = roll.completion_mask[rows]
    weights, stats = importance_weights(logprobs, roll.logprobs[rows], mask, "none", cfg.is_clip)
    return stats | lag_stats(roll) | {"is/weight_mean": weights.mean()}


def floats(stats: Stats) -> dict[str, float]:
    """Stats as logged numbers."""
    return {k: float(v) for k, v in stats.items()}
