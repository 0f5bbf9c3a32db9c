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


def leave_one_out(rewards: Tensor) -> Tensor:
    """RLOO advantages, eq. (4)-(5): A_i = R_i - mean_{j != i} R_j.

    rewards: (B, K) -> (B, K). Equals K/(K-1) * (R_i - mean_j R_j).
    The baseline leaves R_i out so it does not depend on sample i (unbiased).
    """
    k = _check_groups(rewards, "leave-one-out")
    # eq. (4): b_i = (sum_j R_j - R_i) / (K - 1)
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
    return rewards - baseline


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


def leave_one_out_token_kl(scores: Tensor, kl: Tensor, mask: Tensor, beta: float, k: int) -> Tensor:
    """RLOO with a token-level KL penalty (ablation of eq. 1, 4): per-token advantages.

    scores: (N,) with N = B*K rows grouped by prompt; kl: (N, T) per-token KL estimates; mask:
    (N, T) bool, True = real token -> (N, T), zero on padding.
        G_{i,t} = score_i - beta * sum_{s >= t} kl_{i,s}     (KL as per-token reward, reward-to-go)
        b_i     = mean_{j != i} R_j,  R_j = score_j - beta * sum_s kl_{j,s}   (eq. 4)
        A_{i,t} = G_{i,t} - b_i
    A token is only charged the KL of itself and later tokens (earlier ones do not depend on it),
    while the score stays a whole-response reward; at t = 0 this is eq. (4)'s advantage.
    """
    _check_mask(kl, mask)
    if scores.shape != kl.shape[:1]:
        raise ValueError(f"scores must be (N,) = ({kl.shape[0]},), got {tuple(scores.shape)}")
    zero = torch.zeros((), dtype=kl.dtype, device=kl.device)
    kl = torch.where(mask, kl.detach(), zero)
    to_go = kl.flip(-1).cumsum(-1).flip(-1)  # sum_{s >= t} kl_s
    totals = scores.detach() - beta * to_go[:, 0]  # R_i of eq. (1)
    baseline = totals - leave_one_out(totals.view(-1, k)).view(-1)  # b_i = R_i - A_i
    advantages = scores.detach()[:, None] - beta * to_go - baseline[:, None]
    return torch.where(mask, advantages, zero)
