"""KL estimators and the KL-shaped reward.

Notation: N completions, T completion length. Masks are bool, True = a real
token that counts. Estimators k1/k2/k3 follow Schulman 2020, "Approximating
KL divergence": with samples y ~ pi and r = log(pi_ref(y) / pi(y)),
    k1 = -r                 unbiased for KL(pi || ref), high variance, can be < 0
    k2 = r^2 / 2            biased, low variance, >= 0
    k3 = (e^r - 1) - r      unbiased, low variance, >= 0
Eq. (1) refers to the RLOO write-up of Ahmadian et al. 2024.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .logprobs import _check_mask, _check_same_shape, masked_sum

ESTIMATORS = ("k1", "k2", "k3")


def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs.

    logprobs (policy), ref_logprobs (reference): (N, T) -> (N, T).
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    log_ratio = ref_logprobs - logprobs  # r = log(ref / pi)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        # expm1 keeps precision when r is near 0, where e^r - 1 would cancel.
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")


def sequence_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str = "k1") -> Tensor:
    """KL of a whole completion: sum of per-token estimates over real tokens.

    logprobs, ref_logprobs: (N, T); mask: (N, T) bool, True = real token -> (N,).
    """
    return masked_sum(kl_per_token(logprobs, ref_logprobs, estimator), mask, dim=-1)


def _check_beta(beta: float) -> None:
    if beta < 0:
        raise ValueError(f"beta (KL coefficient) must be >= 0, got {beta}")


def shaped_reward(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    beta: float,
    estimator: str = "k1",
) -> tuple[Tensor, Tensor]:
    """Sequence reward of eq. (1): R = score - beta * sum_t kl_t.

    scores: (N,) reward-model scores; logprobs, ref_logprobs: (N, T); mask:
    (N, T) bool, True = real token. Returns (rewards (N,), kl (N,)), detached:
    the policy gradient (eq. 2) treats R as a fixed number, not a function of theta.
    """
    _check_beta(beta)
    if scores.shape != logprobs.shape[:1]:
        raise ValueError(f"scores must be (N,) = ({logprobs.shape[0]},), got {tuple(scores.shape)}")
    kl = sequence_kl(logprobs, ref_logprobs, mask, estimator).detach()
    return scores.detach() - beta * kl, kl


def token_level_rewards(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    beta: float,
    estimator: str = "k1",
) -> Tensor:
    """PPO-style per-token rewards: -beta * kl_t on each real token, plus the
    score on the last real token of each sequence, as in PPO-based RLHF
    (Ouyang et al. 2022), where GAE then spreads it over the tokens.

    scores: (N,); logprobs, ref_logprobs, mask: (N, T), mask bool, True = real
    token -> (N, T), detached. Each row sums to eq. (1)'s R. A row with no real
    tokens gets all zeros (its score has nowhere to go).
    """
    _check_beta(beta)
    if scores.shape != logprobs.shape[:1]:
        raise ValueError(f"scores must be (N,) = ({logprobs.shape[0]},), got {tuple(scores.shape)}")
    kl = kl_per_token(logprobs, ref_logprobs, estimator).detach()
    _check_mask(kl, mask)
    zero = torch.zeros((), dtype=kl.dtype, device=kl.device)
    rewards = torch.where(mask, -beta * kl, zero)
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=-1).values  # -1 when no real token
    has_token = last >= 0
    score_at_end = torch.where(has_token, scores.detach().to(rewards.dtype), zero)
    return rewards.scatter_add(-1, last.clamp(min=0).unsqueeze(-1), score_at_end.unsqueeze(-1))
