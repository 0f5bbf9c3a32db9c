"""Advantage estimators: pure tensor math.

Notation: B prompts, K samples per prompt, N = B*K completions, T completion
length. Masks are bool, True = a real token that counts.
Equation numbers (eq. 1-5) refer to the RLOO write-up of Ahmadian et al. 2024,
"Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
Human Feedback in LLMs".
"""

from __future__ import annotations

import torch
from torch import Tensor

from .logprobs import _check_mask, _check_same_shape, masked_mean


def _check_groups(rewards: Tensor, method: str) -> int:
    if rewards.dim() != 2:
        raise ValueError(f"{method} expects rewards of shape (B, K), got shape {tuple(rewards.shape)}")
    k = rewards.shape[1]
    if k < 2:
        raise ValueError(f"{method} needs k >= 2 samples per prompt, got k={k}")
    return k


def leave_one_out(rewards: Tensor, valid: Tensor | None = None) -> Tensor:
    """RLOO advantages, eq. (4)-(5): A_i = R_i - mean_{j != i, valid_j} R_j. The one leave-one-out
    function: every baseline of rloo (eq. 4, the token-level KL's, the off-policy eq. A4's) is this.

    rewards: (B, K) -> (B, K); valid: (B, K) bool or None (every sample scored). An unscored sample
    (valid False: a reward function's None; its reward may hold anything, NaN included, it is never
    read) is left out of every baseline and gets advantage 0, as does a sample with no scored
    neighbour (no baseline exists). With every sample scored this is (K/(K-1)) * (R_i - mean_j R_j),
    and the same floats as (R_i - (sum_j R_j - R_i) / (K - 1)): the count K - 1 is exact.
    The baseline leaves R_i out so it does not depend on sample i (unbiased).
    """
    _check_groups(rewards, "leave-one-out")
    valid = _valid_or_all(rewards, valid)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    m = valid.to(rewards.dtype)
    others = m.sum(dim=1, keepdim=True) - m  # scored neighbours of each sample
    # eq. (4): b_i = (sum_j R_j - R_i) / (number of others)
    baseline = (r.sum(dim=1, keepdim=True) - r) / others.clamp(min=1)
    return torch.where(valid & (others > 0), r - baseline, torch.zeros_like(r))


def moving_average_update(baseline: Tensor, rewards: Tensor, momentum: float) -> Tensor:
    """Moving-average baseline for REINFORCE (eq. 3): m*b + (1-m)*mean(R).

    baseline: 0-d, rewards: any shape (usually (N,)) -> 0-d. momentum in [0, 1).
    Call after computing this batch's advantages, so the baseline used for a
    batch never depends on that batch's samples.
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    if baseline.dim() != 0:
        raise ValueError(f"baseline must be a 0-d tensor, got shape {tuple(baseline.shape)}")
    if rewards.numel() == 0:
        raise ValueError("rewards is empty: nothing to average")
    # A running statistic, not part of any graph.
    return momentum * baseline.detach() + (1.0 - momentum) * rewards.detach().mean()


def moving_average_advantages(rewards: Tensor, baseline: Tensor) -> Tensor:
    """REINFORCE-with-baseline advantages, eq. (3): A = R - b.

    rewards: (N,), baseline: 0-d from BEFORE this batch (independent of the
    samples, hence unbiased) -> (N,).
    """
    if baseline.dim() != 0:
        raise ValueError(f"baseline must be a 0-d tensor, got shape {tuple(baseline.shape)}")
    return rewards - baseline.detach()


def group_normalized(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO advantages (Shao et al. 2024, DeepSeekMath): (R - mean) / (std + eps) per group.

    rewards: (B, K) -> (B, K); std is the unbiased sample std over the K samples.
    A group whose rewards are all equal carries no signal and gets exact zeros
    (R - mean can be a rounding error away from 0, which eps would blow up).
    """
    _check_groups(rewards, "group normalization")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    normalized = (rewards - mean) / (std + eps)
    constant = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(normalized), normalized)


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, eq. 16).

    rewards, values: (N, T) per token; mask: (N, T) bool, True = real completion
    token, right-padded (False only after the end). Returns (advantages,
    returns), both (N, T), zero where mask is False. The episode ends at the
    last real token, so the value after it is 0. Outputs are regression and
    policy targets, so they carry no gradient.
        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1},   returns_t = A_t + V_t
    """
    _check_same_shape(rewards=rewards, values=values)
    _check_mask(rewards, mask)
    if rewards.dim() != 2:
        raise ValueError(f"gae expects (N, T) tensors, got shape {tuple(rewards.shape)}")
    if (mask[:, 1:] & ~mask[:, :-1]).any():
        raise ValueError("gae expects a right-padded mask (no True after a False in a row)")
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    rewards = torch.where(mask, rewards.detach(), zero)
    values = torch.where(mask, values.detach(), zero)

    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    steps = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        # Padding steps hold zero so the recursion restarts cleanly at each sequence's end.
        next_adv = torch.where(mask[:, t], delta + gamma * lam * next_adv, zero)
        next_value = values[:, t]
        steps.append(next_adv)
    if steps:
        advantages = torch.stack(steps[::-1], dim=1)
    else:
        advantages = torch.zeros_like(rewards)
    returns = torch.where(mask, advantages + values, zero)
    return advantages, returns


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Masked normalisation to mean 0, std 1 over real tokens (PPO advantage whitening).

    x, mask: same shape, mask bool (True = real token) -> same shape, zero where
    mask is False. Uses the population std over the real tokens.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return torch.where(mask, out, torch.zeros_like(out))


def kl_to_go(kl: Tensor, mask: Tensor) -> Tensor:
    """The KL still to come at each token, sum_{s >= t} kl_s over real tokens (a per-token KL reward's
    reward-to-go): kl, mask (N, T) -> (N, T), detached, 0 on padding at the end."""
    _check_mask(kl, mask)
    zero = torch.zeros((), dtype=kl.dtype, device=kl.device)
    return torch.where(mask, kl.detach(), zero).flip(-1).cumsum(-1).flip(-1)


def unscored(scores: Tensor) -> tuple[Tensor, Tensor]:
    """Split scores where NaN marks "could not score" (a reward function's None):
    (scores with 0 in those places, valid: True where scored). Any shape."""
    valid = ~torch.isnan(scores)
    return torch.where(valid, scores, torch.zeros_like(scores)), valid


def _valid_or_all(rewards: Tensor, valid: Tensor | None) -> Tensor:
    if valid is None:
        return torch.ones_like(rewards, dtype=torch.bool)
    if valid.shape != rewards.shape or valid.dtype != torch.bool:
        raise ValueError(
            f"valid must be a bool tensor of shape {tuple(rewards.shape)}, got {valid.dtype} {tuple(valid.shape)}"
        )
    return valid


def group_mean_advantages(rewards: Tensor, valid: Tensor | None = None) -> Tensor:
    """Dr. GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
    Perspective", sec. 3.2): A_i = R_i - mean of its group, *without* GRPO's division by the
    group std (which up-weights groups that are almost all right or all wrong).

    rewards: (B, K) -> (B, K). ``valid`` (B, K) bool: unscored samples are left out of the mean and
    get 0 (as in ``leave_one_out``); a group with no scored sample is all zeros. Equals
    (K-1)/K times the leave-one-out advantage when every sample is scored.
    """
    _check_groups(rewards, "group mean")
    valid = _valid_or_all(rewards, valid)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    count = valid.sum(dim=1, keepdim=True).clamp(min=1).to(rewards.dtype)
    mean = r.sum(dim=1, keepdim=True) / count
    return torch.where(valid, r - mean, torch.zeros_like(r))


def group_normalized_valid(rewards: Tensor, valid: Tensor, eps: float = 1e-6) -> Tensor:
    """``group_normalized`` (GRPO) over the scored samples of each group only; unscored samples
    and groups with fewer than two scored samples (no std) get 0. rewards, valid: (B, K) -> (B, K)."""
    _check_groups(rewards, "group normalization")
    valid = _valid_or_all(rewards, valid)
    centred = group_mean_advantages(rewards, valid)
    count = valid.sum(dim=1, keepdim=True).to(rewards.dtype)
    std = (centred.pow(2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    first = torch.where(valid, rewards, torch.full_like(rewards, float("inf"))).amin(dim=1, keepdim=True)
    last = torch.where(valid, rewards, torch.full_like(rewards, float("-inf"))).amax(dim=1, keepdim=True)
    signal = (count >= 2) & (first != last)  # not constant (same exact-zero rule as GRPO)
    return torch.where(valid & signal, centred / (std + eps), torch.zeros_like(centred))


def reinforce_pp_advantages(
    scores: Tensor, kl: Tensor, mask: Tensor, beta: float, valid: Tensor | None = None, eps: float = 1e-8
) -> Tensor:
    """REINFORCE++ advantages (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning
    Large Language Models", eq. 6-8; OpenRLHF's ``reinforce`` estimator).

    scores: (N,) reward-source scores; kl: (N, T) per-token KL estimates; mask: (N, T) bool, True =
    real token; valid: (N,) bool or None (unscored rows get 0 and are left out of the statistics).
        G_{i,t} = score_i - beta * sum_{s >= t} kl_{i,s}    (KL as a per-token reward, reward-to-go)
        A_{i,t} = (G_{i,t} - mean G) / std G                 (mean, std over every real token of
                                                              every scored row of the whole batch)
    No critic and no per-prompt baseline: the baseline and the scale are the batch's. -> (N, T),
    zero on padding. The std is the population std over those tokens.
    """
    _check_mask(kl, mask)
    if scores.shape != kl.shape[:1]:
        raise ValueError(f"scores must be (N,) = ({kl.shape[0]},), got {tuple(scores.shape)}")
    valid = torch.ones_like(scores, dtype=torch.bool) if valid is None else valid
    s = torch.where(valid, scores.detach(), torch.zeros_like(scores))
    returns = s[:, None] - beta * kl_to_go(kl, mask)
    keep = mask & valid[:, None]
    if not keep.any():
        return torch.zeros_like(returns)
    return whiten(returns, keep, eps)


def zero_variance_groups(scores: Tensor, valid: Tensor | None = None) -> Tensor:
    """Groups whose scored samples all have the same score (or fewer than two are scored): no
    group baseline gives them a gradient from the score. scores, valid: (B, K) -> (B,) bool."""
    if scores.dim() != 2:
        raise ValueError(f"expects scores of shape (B, K), got shape {tuple(scores.shape)}")
    valid = _valid_or_all(scores, valid)
    hi = torch.where(valid, scores, torch.full_like(scores, float("-inf"))).amax(dim=1)
    lo = torch.where(valid, scores, torch.full_like(scores, float("inf"))).amin(dim=1)
    return (valid.sum(dim=1) < 2) | (hi == lo)
