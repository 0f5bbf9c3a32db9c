"""Bounded off-policy estimators for RLOO beside tis/mis (rl.is_correction; docs/async.md,
"Bounded estimators", derives each: what it estimates, its bias, when it is exact).

Notation: N completions, T completion length, masks bool (True = a real token). `logprobs` (N,T)
log pi of the policy being trained (carries the gradient), `behaviour_logprobs` (N,T) log mu of
the policy that sampled, `advantages` (N,) eq. 4's leave-one-out advantages A_i (eq. A1's rewards).
rho_i = pi(y_i|x) / mu(y_i|x) (sequence), rho_it = pi(y_t|.) / mu(y_t|.) (token).

  asymre             loss = -1/N sum_i (A_i + delta) log pi(y_i|x)                     (no weight; AsymRE,
             arXiv 2506.20520: the baseline shifted delta below the leave-one-out mean)
  topr               loss = -1/N sum_i w_i A_i log pi(y_i|x),  w_i = 1 if s_i >= 0 else min(rho_i, 1)
             (after TOPR, arXiv 2503.14286: truncated IS on the negative side only; s_i = A_i, rloo's
             split, or R_i, the paper's: `split_on`)
  cispo              loss = -1/N sum_i A_i sum_t sg(clip(rho_it, c_low, C)) log pi(y_it|.)   (CISPO, arXiv
             2506.13585: the clipped weight detached, the gradient through log pi on every token)
  clipped_surrogate  loss = -1/N sum_i min(rho_i A_i, clip(rho_i, 1-eps, 1+eps) A_i)
             (rloo_clip's sequence-level surrogate, rloo.core.estimators' clip_sequence, with mu as the old
             policy; the gradient through rho)
Every weight is detached but clipped_surrogate's ratio, whose gradient rho_i grad log pi(y_i|x) is the point.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .importance import ratio_stats, sequence_log_ratio, token_log_ratio, weighted_policy_gradient_loss
from .logprobs import sequence_logprobs
from .losses import ppo_clip_loss

# the estimators of this module: sequence-level, rloo's update only (rloo.config.offpolicy)
BOUNDED = ("asymre", "topr", "cispo", "clipped_surrogate")
Stats = dict[str, Tensor]


def asymmetric_advantages(advantages: Tensor, shift: float) -> Tensor:
    """AsymRE: A_i + delta, the leave-one-out baseline lowered by delta >= 0. (N,) -> (N,).
    The shift adds delta E_mu[grad log pi(y)] = delta sum_y (mu(y)/pi(y)) grad pi(y) to the expected
    update: 0 at mu = pi (sum_y grad pi(y) = 0), so on-policy it changes the variance only."""
    return advantages.detach() + shift


def topr_weights(log_ratio: Tensor, split_on: Tensor) -> Tensor:
    """TOPR: w_i = 1 where s_i >= 0 (kept as sampled, untruncated and unweighted, as the paper's eq.),
    min(rho_i, 1) where s_i < 0. log_ratio (N,) = log rho_i; split_on (N,) = s_i: the advantages A_i
    (rloo's rule) or the rewards R_i (the paper's, which splits on the sign of R(tau)) -> (N,) detached."""
    truncated = torch.exp(log_ratio.detach().clamp(max=0.0))  # min(rho, 1) in log space: no overflow
    return torch.where(split_on.detach() >= 0, torch.ones_like(truncated), truncated)


def cispo_weights(log_ratio: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """CISPO: w_it = sg(clip(rho_it, low, high)), 0 on padding. log_ratio (N,T) = log rho_it -> (N,T).
    low in [0, 1), high = C > 1; low = 0 is MiniMax's setting (no lower bound: tis_token's weight)."""
    if not 0.0 <= low < 1.0 < high:
        raise ValueError(f"CISPO's clip range needs 0 <= low < 1 < high, got [{low}, {high}]")
    w = torch.exp(log_ratio.detach()).clamp(low, high)
    return torch.where(mask, w, torch.zeros_like(w))


def bounded_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    estimator: str,
    *,
    clip: float,
    clip_low: float = 0.0,
    shift: float = 0.0,
    clip_eps: float = 0.2,
    split_on: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """The loss of `estimator` (module docstring) and its stats: loss/policy, adv/mean, adv/std,
    is/weight_mean, the ratio's is/* (ratio_stats, with `clip` as C), and is/clipped (topr: share
    of samples truncated, s < 0 and rho < 1; cispo: of tokens clipped; clipped_surrogate: ppo/clipfrac).
    split_on (N,): topr's s_i, the advantages when None (see topr_weights)."""
    seq_lr = sequence_log_ratio(logprobs, behaviour_logprobs, mask)
    stats = ratio_stats(seq_lr, clip)
    if estimator == "clipped_surrogate":  # the gradient through rho itself: no detached weight
        seq_lp, seq_mu = sequence_logprobs(logprobs, mask), sequence_logprobs(behaviour_logprobs.detach(), mask)
        loss, ppo = ppo_clip_loss(seq_lp, seq_mu, advantages, clip_eps=clip_eps)
        adv = advantages.detach()
        out = {"loss/policy": loss.detach(), "adv/mean": adv.mean(), "adv/std": adv.std(correction=0)}
        return loss, stats | out | {"is/weight_mean": ppo["ppo/ratio_mean"], "is/clipped": ppo["ppo/clipfrac"]}
    # the others: -1/N sum_i A_i sum_t w_it log pi(y_it|.) with each estimator's detached weights
    if estimator == "asymre":
        advantages = asymmetric_advantages(advantages, shift)
        w, own = torch.ones_like(advantages), {}
    elif estimator == "topr":
        s = advantages if split_on is None else split_on
        w, own = topr_weights(seq_lr, s), {"is/clipped": ((s < 0) & (seq_lr < 0)).double().mean().float()}
    elif estimator == "cispo":
        tok_lr = token_log_ratio(logprobs, behaviour_logprobs, mask)
        w, rho = cispo_weights(tok_lr, mask, clip_low, clip), torch.exp(tok_lr)
        clipped = ((rho < clip_low) | (rho > clip)) & mask
        stats = ratio_stats(tok_lr, clip, mask)  # a token-level estimator: the tokens' ratios
        own = {"is/clipped": (clipped.double().sum() / mask.sum().clamp(min=1)).float()}
    else:
        raise ValueError(f"unknown bounded estimator {estimator!r}; choose one of {', '.join(BOUNDED)}")
    loss, out = weighted_policy_gradient_loss(logprobs, mask, advantages, w)
    return loss, stats | out | own
