"""Losses: pure tensor math, each returning ``(loss, stats)``.

Notation: B prompts, K samples per prompt, N = B*K completions (or N pairs for
preference losses), T completion length. Masks are bool, True = a real token
that counts; where a mask is optional, None means every element counts.
``stats`` maps a metric name to a detached 0-d tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .logprobs import _check_same_shape, masked_difference, masked_mean

Stats = dict[str, Tensor]


def _mean(x: Tensor, mask: Tensor | None) -> Tensor:
    return x.mean() if mask is None else masked_mean(x, mask)


def weigh(advantages: Tensor, weights: Tensor | None) -> Tensor:
    """Advantages (N,) or (N,T) times detached importance weights w >= 0 (N,T) or None (docs/async.md
    eq. A3); as w * min(r A, clip(r) A) = min(r wA, clip(r) wA), a clipped surrogate with wA is w times it."""
    if weights is None:
        return advantages
    return (advantages[:, None] if advantages.dim() == 1 else advantages).detach() * weights.detach()


def policy_gradient_loss(seq_logprobs: Tensor, advantages: Tensor) -> tuple[Tensor, Stats]:
    """REINFORCE / RLOO loss, eq. (5): loss = -mean_i(A_i * log pi(y_i|x)).

    seq_logprobs: (N,) summed log-probs of each completion (carries the
    gradient); advantages: (N,), e.g. leave_one_out(...).flatten(). Advantages
    are detached: they weight the score function and must not be differentiated.
    """
    _check_same_shape(seq_logprobs=seq_logprobs, advantages=advantages)
    advantages = advantages.detach()
    loss = -(advantages * seq_logprobs).mean()
    stats = {
        "loss/policy": loss.detach(),
        "adv/mean": advantages.mean(),
        "adv/std": advantages.std(correction=0),  # population std: defined for N = 1
    }
    return loss, stats


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    clip_eps: float = 0.2,
) -> tuple[Tensor, Stats]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), negated for descent.

    loss = -mean over real tokens of min(ratio*A, clip(ratio, 1-eps, 1+eps)*A),
    ratio = exp(logprobs - old_logprobs).
    Token level: logprobs, old_logprobs (N, T), mask (N, T) bool, advantages
    (N, T) or (N,) shared by every token of a completion (GRPO).
    Sequence level (RLOO + clipping ablation): all (N,), mask None.
    stats: "loss/ppo", "ppo/clipfrac" (share of real tokens where the clipped
    term was the smaller, active one), "ppo/ratio_mean", "ppo/approx_kl"
    (k3 estimate of KL(old || new)).
    """
    if clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps}")
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    if logprobs.dim() == 2 and advantages.shape == logprobs.shape[:1]:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)  # one advantage per completion
    if advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must have the shape of logprobs {tuple(logprobs.shape)} "
            f"(or (N,) for token-level logprobs), got {tuple(advantages.shape)}"
        )
    advantages = advantages.detach()
    # masked before the exp: a masked position's log-prob may be anything (masked_difference)
    old = old_logprobs.detach()
    log_ratio = logprobs - old if mask is None else masked_difference(logprobs, old, mask)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -_mean(torch.minimum(unclipped, clipped), mask)

    with torch.no_grad():
        stats = {
            "loss/ppo": loss.detach(),
            "ppo/clipfrac": _mean((clipped < unclipped).to(ratio.dtype), mask),
            "ppo/ratio_mean": _mean(ratio, mask),
            "ppo/approx_kl": _mean(torch.expm1(log_ratio) - log_ratio, mask),
        }
    return loss, stats


def value_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor | None,
    old_values: Tensor | None = None,
    clip_eps: float | None = None,
) -> tuple[Tensor, Stats]:
    """Value-function loss: 0.5 * mean over real tokens of (V - returns)^2.

    values, returns: (N, T) (or (N,) with mask None); mask (N, T) bool, True =
    real token. With clip_eps, PPO value clipping (as in OpenAI baselines'
    PPO2): V_clip = old + clip(V - old, -eps, eps), error = max of the clipped
    and unclipped squared errors, so a value update cannot profit from moving
    far from old_values. old_values is ignored when clip_eps is None.
    stats: "loss/value", "value/clipfrac" (only when clipping).
    """
    _check_same_shape(values=values, returns=returns)
    returns = returns.detach()
    error = (values - returns) ** 2
    stats: Stats = {}
    if clip_eps is not None:
        if old_values is None:
            raise ValueError("value clipping (clip_eps set) needs old_values")
        if clip_eps <= 0:
            raise ValueError(f"clip_eps must be > 0, got {clip_eps}")
        _check_same_shape(values=values, old_values=old_values)
        old_values = old_values.detach()
        clipped_values = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        clipped_error = (clipped_values - returns) ** 2
        stats["value/clipfrac"] = _mean((clipped_error > error).to(error.dtype), mask).detach()
        error = torch.maximum(error, clipped_error)
    loss = 0.5 * _mean(error, mask)
    stats["loss/value"] = loss.detach()
    return loss, stats


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float,
) -> tuple[Tensor, Stats]:
    """DPO loss (Rafailov et al. 2023, eq. 7).

    All inputs (N,) summed log-probs of the chosen / rejected completion under
    the policy and the frozen reference.
        margin = beta * ((pc - rc) - (pr - rr)),   loss = -mean logsigmoid(margin)
    stats: "loss/dpo", "dpo/accuracy" (share with margin > 0), "dpo/margin",
    "dpo/chosen_reward", "dpo/rejected_reward" (implicit rewards beta * log-ratio).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    _check_same_shape(
        policy_chosen=policy_chosen,
        policy_rejected=policy_rejected,
        ref_chosen=ref_chosen,
        ref_rejected=ref_rejected,
    )
    chosen_reward = beta * (policy_chosen - ref_chosen.detach())
    rejected_reward = beta * (policy_rejected - ref_rejected.detach())
    margin = chosen_reward - rejected_reward
    loss = -F.logsigmoid(margin).mean()
    stats = {
        "loss/dpo": loss.detach(),
        "dpo/accuracy": (margin > 0).float().mean().detach(),
        "dpo/margin": margin.mean().detach(),
        "dpo/chosen_reward": chosen_reward.mean().detach(),
        "dpo/rejected_reward": rejected_reward.mean().detach(),
    }
    return loss, stats


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor) -> tuple[Tensor, Stats]:
    """Reward-model loss under the Bradley-Terry model: -mean logsigmoid(c - r).

    chosen_scores, rejected_scores: (N,) reward-model scores of each pair.
    stats: "loss/rm", "rm/accuracy" (share with c > r; ties count as wrong), "rm/margin".
    """
    _check_same_shape(chosen_scores=chosen_scores, rejected_scores=rejected_scores)
    margin = chosen_scores - rejected_scores
    loss = -F.logsigmoid(margin).mean()
    stats = {
        "loss/rm": loss.detach(),
        "rm/accuracy": (margin > 0).float().mean().detach(),
        "rm/margin": margin.mean().detach(),
    }
    return loss, stats


def sft_loss(token_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Stats]:
    """Supervised fine-tuning: negative log-likelihood averaged over real tokens.

    token_logprobs: (N, T); mask: (N, T) bool, True = real target token.
    Token-averaged, so long targets weigh more than short ones.
    stats: "loss/sft".
    """
    loss = -masked_mean(token_logprobs, mask)
    return loss, {"loss/sft": loss.detach()}


def raft_select(rewards: Tensor) -> Tensor:
    """RAFT (Dong et al. 2023): index of the best of K samples for each prompt.

    rewards: (B, K) -> (B,) long; ties go to the first sample.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 1:
        raise ValueError(f"raft_select expects rewards of shape (B, K) with K >= 1, got {tuple(rewards.shape)}")
    return torch.argmax(rewards, dim=1)  # documented to return the first maximum


def token_policy_gradient_loss(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Stats]:
    """Per-token REINFORCE without a ratio: -mean over real tokens of A_t * log pi(y_t | ...).

    The 'vanilla policy gradient' of Ahmadian et al. 2024 (sec. 3): PPO's objective with no
    ratio to an old policy and no clipping (Williams 1992 with per-token advantages, e.g. GAE
    with lambda = 1). logprobs, advantages: (N, T); mask: (N, T) bool, True = real token.
    stats: "loss/policy".
    """
    _check_same_shape(logprobs=logprobs, advantages=advantages)
    loss = -masked_mean(advantages.detach() * logprobs, mask)
    return loss, {"loss/policy": loss.detach()}


def sequence_sum_policy_gradient_loss(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Stats]:
    """REINFORCE with per-token advantages, summed over a completion's tokens and averaged over
    completions: -mean_i sum_t A_{i,t} log pi(y_{i,t} | ...). With A_{i,t} = A_i for every t this
    is exactly eq. (5)'s loss (policy_gradient_loss). logprobs, advantages: (N, T); mask (N, T)
    bool, True = real token. stats: "loss/policy"."""
    _check_same_shape(logprobs=logprobs, advantages=advantages)
    kept = torch.where(mask, advantages.detach() * logprobs, torch.zeros((), dtype=logprobs.dtype))
    loss = -kept.sum(-1).mean()
    return loss, {"loss/policy": loss.detach()}


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    beta: float,
    weights: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """GRPO objective (Shao et al. 2024, DeepSeekMath eq. 3), negated for descent.

    loss = ppo_clip_loss(logprobs, old_logprobs, A, mask) + beta * mean_t k3(pi, pi_ref)_t, with
    A (N,) the group-normalized advantage shared by every token of a completion and the KL to the
    reference in the loss (the unbiased k3 estimator, DeepSeekMath eq. 4), not in the reward.
    Tokens are averaged over the whole batch. logprobs, old_logprobs, ref_logprobs, mask: (N, T).
    stats: ppo_clip_loss's plus "loss/kl" (the mean k3 term, before beta). weights (N,T): each
    token's terms times w (`weigh`; samples of another policy, docs/async.md eq. A3).
    """
    policy_loss, stats = ppo_clip_loss(logprobs, old_logprobs, weigh(advantages, weights), mask, clip_eps)
    log_ratio = masked_difference(ref_logprobs.detach(), logprobs, mask)  # 0 where masked: safe to exp
    k3 = torch.expm1(log_ratio) - log_ratio  # Schulman 2020
    kl = masked_mean(k3 if weights is None else weights.detach() * k3, mask)
    return policy_loss + beta * kl, stats | {"loss/kl": kl.detach()}


def dr_grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    beta: float,
    norm_length: float,
    weights: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """Dr. GRPO objective (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3 and their
    reference code), negated for descent: GRPO's clipped surrogate and k3 KL, but each completion's
    token terms are *summed* and divided by one constant ``norm_length`` (the generation budget),
    not by the completion's own length, so a wrong answer is not pushed down less per token for
    being long:

        loss = -1/(N L) sum_i sum_{t <= |y_i|} [min(ratio A_i, clip(ratio) A_i) - beta k3_t]

    logprobs, old_logprobs, ref_logprobs, mask: (N, T), mask bool True = real token; advantages
    (N,) (``group_mean_advantages``), shared by a completion's tokens; L = norm_length > 0.
    stats: "loss/policy", "loss/kl" (the k3 sum / (N L), before beta), "ppo/clipfrac". weights
    (N,T): each token's terms times w (as grpo_loss's).
    """
    if clip_eps <= 0 or norm_length <= 0:
        raise ValueError(f"clip_eps and norm_length must be > 0, got {clip_eps}, {norm_length}")
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs)
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (N,) = ({logprobs.shape[0]},), got {tuple(advantages.shape)}")
    adv = advantages.detach()[:, None] if weights is None else weigh(advantages, weights)
    ratio = torch.exp(masked_difference(logprobs, old_logprobs.detach(), mask))  # 0 where masked: safe to exp
    unclipped, clipped = ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    scale = logprobs.shape[0] * norm_length
    policy = -torch.where(mask, torch.minimum(unclipped, clipped), zero).sum() / scale
    log_ratio = masked_difference(ref_logprobs.detach(), logprobs, mask)
    k3 = torch.expm1(log_ratio) - log_ratio  # Schulman 2020
    kl = torch.where(mask, k3 if weights is None else weights.detach() * k3, zero).sum() / scale
    with torch.no_grad():
        clipfrac = masked_mean((clipped < unclipped).to(ratio.dtype), mask)
    return policy + beta * kl, {"loss/policy": policy.detach(), "loss/kl": kl.detach(), "ppo/clipfrac": clipfrac}
