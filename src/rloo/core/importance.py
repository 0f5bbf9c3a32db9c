"""Importance sampling for off-policy RLOO: samples drawn from a behaviour policy mu (the weights
of N updates ago, or a sampler whose log-probs differ from the trainer's) used to estimate the
gradient of the current policy pi (docs/async.md derives the estimator and its bias).

Notation: N completions, T completion length. Masks are bool, True = a real token that counts.
`logprobs` are log pi(y_t|x, y_<t) under the current policy, `behaviour_logprobs` those of mu,
both (N, T) and 0 (or anything) where the mask is False.

Corrections (C = `clip` > 1):
    tis        w_i = min(rho_i, C),                 rho_i = pi(y_i|x) / mu(y_i|x)   (sequence)
    mis        w_i = rho_i * 1{1/C <= rho_i <= C}                                    (sequence)
    tis_token  w_it = min(rho_it, C),               rho_it = pi(y_t|.) / mu(y_t|.)   (token)
    mis_token  w_it = rho_it * 1{1/C <= rho_it <= C}                                 (token)
    none       w = 1
Weights are detached: they rescale the score function, they are not differentiated (eq. A2).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .logprobs import _check_mask, _check_same_shape, masked_mean, masked_sum

CORRECTIONS = ("tis", "mis", "tis_token", "mis_token", "none")
Stats = dict[str, Tensor]


def _check_clip(clip: float) -> None:
    if not clip > 1.0:
        raise ValueError(f"the importance-ratio clip C must be > 1, got {clip}")


def token_log_ratio(logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log rho_it = log pi(y_t|.) - log mu(y_t|.) on real tokens, 0 on padding. (N,T),(N,T),(N,T) -> (N,T)."""
    _check_same_shape(logprobs=logprobs, behaviour_logprobs=behaviour_logprobs)
    _check_mask(logprobs, mask)
    diff = logprobs.detach() - behaviour_logprobs.detach()
    # where, not multiplication: -inf at a padded position must not become NaN
    return torch.where(mask, diff, torch.zeros((), dtype=diff.dtype, device=diff.device))


def sequence_log_ratio(logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log rho_i = log pi(y_i|x) - log mu(y_i|x) = sum_t mask_it (log pi_it - log mu_it). -> (N,)."""
    return masked_sum(token_log_ratio(logprobs, behaviour_logprobs, mask), mask, dim=-1)


def truncated_weights(log_ratio: Tensor, clip: float) -> Tensor:
    """Truncated IS (tis): w = min(rho, C) = exp(min(log rho, log C)), any shape -> same shape.
    Taken in log space so a huge ratio (exp overflow) gives exactly C, not inf."""
    _check_clip(clip)
    return torch.exp(log_ratio.detach().clamp(max=math.log(clip)))


def masked_weights(log_ratio: Tensor, clip: float) -> Tensor:
    """Masked IS (mis): w = rho where 1/C <= rho <= C, else 0. Any shape -> same shape."""
    _check_clip(clip)
    lr = log_ratio.detach()
    inside = lr.abs() <= math.log(clip)
    return torch.where(inside, torch.exp(lr.clamp(-math.log(clip), math.log(clip))), torch.zeros_like(lr))


def importance_weights(
    logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, correction: str, clip: float
) -> tuple[Tensor, Stats]:
    """The detached weights of `correction` (see the module docstring) and their stats.

    logprobs, behaviour_logprobs, mask: (N, T). Returns weights (N,) for sequence-level corrections
    and `none`, (N, T) for token-level ones (0 on padding), and `ratio_stats` of the ratio they use.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown importance correction {correction!r}; choose one of {', '.join(CORRECTIONS)}")
    token = correction.endswith("_token")
    if token:
        log_ratio = token_log_ratio(logprobs, behaviour_logprobs, mask)
        level_mask: Tensor | None = mask
    else:
        log_ratio = sequence_log_ratio(logprobs, behaviour_logprobs, mask)
        level_mask = None
    if correction == "none":
        weights = torch.ones_like(log_ratio)
    elif correction.startswith("tis"):
        weights = truncated_weights(log_ratio, clip)
    else:
        weights = masked_weights(log_ratio, clip)
    if token:
        weights = torch.where(mask, weights, torch.zeros_like(weights))
    return weights, ratio_stats(log_ratio, clip, level_mask)


def ratio_stats(log_ratio: Tensor, clip: float, mask: Tensor | None = None) -> Stats:
    """Distribution of rho = exp(log_ratio) over sequences (mask None, log_ratio (N,)) or real tokens
    (mask (N,T)): is/ratio_mean, is/ratio_max, is/ratio_min, is/truncated (share of mu's samples with
    rho > C: what tis truncates), is/truncated_pi (E_mu[rho 1{rho > C}], an unbiased estimate of
    P_pi(rho > C), the probability in tis's bias bound: at least C times is/truncated), is/masked
    (share with rho outside [1/C, C]: what mis drops). Detached 0-d tensors."""
    _check_clip(clip)
    lr = log_ratio.detach().double()  # exp in float64: a logged mean of ratios near e^80 stays finite
    if mask is None:
        mask = torch.ones_like(lr, dtype=torch.bool)
    _check_mask(lr, mask)
    rho = torch.exp(lr)
    log_c = math.log(clip)
    real = rho[mask] if mask.any() else torch.ones(1, dtype=rho.dtype, device=rho.device)
    return {
        "is/ratio_mean": masked_mean(rho, mask).float(),
        "is/ratio_max": real.max().float(),
        "is/ratio_min": real.min().float(),
        "is/truncated": masked_mean((lr > log_c).double(), mask).float(),
        "is/truncated_pi": masked_mean(torch.where(lr > log_c, rho, 0.0), mask).float(),
        "is/masked": masked_mean((lr.abs() > log_c).double(), mask).float(),
    }


def weighted_policy_gradient_loss(
    logprobs: Tensor, mask: Tensor, advantages: Tensor, weights: Tensor
) -> tuple[Tensor, Stats]:
    """Importance-weighted RLOO loss (docs/async.md, eq. A2), negated for descent:

        sequence weights w (N,):   loss = -1/N sum_i w_i A_i sum_t log pi(y_it|.)
        token weights w (N,T):     loss = -1/N sum_i A_i sum_t w_it log pi(y_it|.)

    logprobs (N,T) carries the gradient; mask (N,T) bool; advantages (N,); weights detached.
    With w = 1 this is `policy_gradient_loss(sequence_logprobs(logprobs, mask), advantages)` (eq. 5).
    stats: loss/policy, adv/mean, adv/std (as policy_gradient_loss), is/weight_mean.
    """
    _check_mask(logprobs, mask)
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (N,) = {tuple(logprobs.shape[:1])}, got {tuple(advantages.shape)}")
    advantages, weights = advantages.detach(), weights.detach()
    if weights.shape == logprobs.shape:
        seq = masked_sum(weights * logprobs, mask, dim=-1)
        weight_mean = masked_mean(weights, mask)
    elif weights.shape == advantages.shape:
        seq = weights * masked_sum(logprobs, mask, dim=-1)
        weight_mean = weights.mean()
    else:
        raise ValueError(f"weights must be (N,) or (N,T), got {tuple(weights.shape)}")
    loss = -(advantages * seq).mean()
    stats = {
        "loss/policy": loss.detach(),
        "adv/mean": advantages.mean(),
        "adv/std": advantages.std(correction=0),
        "is/weight_mean": weight_mean.detach(),
    }
    return loss, stats


def kl_outside_loss(
    logprobs: Tensor, mask: Tensor, reward_advantages: Tensor, kl_advantages: Tensor, weights: Tensor
) -> tuple[Tensor, Stats]:
    """Eq. A2 with eq. 1's KL penalty outside the importance weights (rl.is_kl=unweighted,
    docs/async.md eq. A4), negated for descent:

        loss = -1/N sum_i [ w_i A^r_i + A^kl_i ] sum_t log pi(y_it|.)         (sequence weights w (N,))
        loss = -1/N sum_i [ A^r_i sum_t w_it log pi(y_it|.) + A^kl_i sum_t log pi(y_it|.) ]   (w (N,T))

    A^r (N,): eq. 4 on the scores; A^kl (N,): eq. 4 on -beta * KL_i (A^r + A^kl: eq. 4 on eq. A1's
    R). logprobs (N,T) carries the gradient; mask (N,T) bool; advantages and weights detached.
    stats: as weighted_policy_gradient_loss, the advantages being A^r + A^kl.
    """
    reward_loss, stats = weighted_policy_gradient_loss(logprobs, mask, reward_advantages, weights)
    if kl_advantages.shape != reward_advantages.shape:
        raise ValueError(f"kl_advantages must be {tuple(reward_advantages.shape)}, got {tuple(kl_advantages.shape)}")
    loss = reward_loss - (kl_advantages.detach() * masked_sum(logprobs, mask, dim=-1)).mean()
    advantages = (reward_advantages + kl_advantages).detach()
    adv = {"adv/mean": advantages.mean(), "adv/std": advantages.std(correction=0)}
    return loss, stats | adv | {"loss/policy": loss.detach()}
