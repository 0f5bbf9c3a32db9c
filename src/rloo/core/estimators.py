"""Advantage estimators and policy losses registered by name (as verl's core_algos.py registers its
estimators with `register_adv_est`): a method of the table (rloo.config.MethodSpec) names one of
each, and the shared clipped-group step (rloo.algorithms.clipped_group) calls them. A new one is a
decorated function here or in the user's own module; nothing else lists them.

Pure functions of tensors and numbers. Notation: N = B*K completions in groups of K, T completion
length; masks are bool, True = a token the policy sampled (the one it is trained on).

  advantage(x: AdvantageInputs, hp) -> (N,) one advantage per completion, shared by its tokens, or
                                       (N,T) one per token, 0 on padding
  loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, weights, hp) -> (loss, stats)
      the update rows' tensors: logprobs (n,T) with the graph; old_logprobs (n,T) the proximal policy's
      (the sampler's on-policy, docs/async.md eq. A3); weights (n,T) detached importance weights of
      pi_prox / mu, or None on-policy

`hp` maps hyperparameter names to values: the method's own settings (clip_eps, norm_length,
kl_estimator, ...) and the run's beta and max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rloo.errors import RewardError

from .advantages import (
    group_mean_advantages,
    group_normalized,
    group_normalized_valid,
    kl_to_go,
    leave_one_out,
    reinforce_pp_advantages,
)
from .kl import kl_per_token
from .logprobs import sequence_logprobs
from .losses import (
    dr_grpo_loss,
    grpo_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    sequence_sum_policy_gradient_loss,
    weigh,
)

Stats = dict[str, Tensor]
Hyper = Mapping[str, Any]


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator may read of a step's N samples."""

    scores: Tensor  # (N,) the reward sources' scores, 0 where unscored
    rewards: Tensor  # (N,) shaped rewards, eq. 1: scores - beta * KL of the sampling policy
    valid: Tensor  # (N,) bool: False = unscored (a reward function's None)
    kept: Tensor  # (N,) bool: the rows that enter the update (zero-variance groups dropped)
    logprobs: Tensor  # (N,T) log-probs of the policy the ratio is taken to (the sampler's on-policy)
    ref_logprobs: Tensor  # (N,T) the reference policy's
    mask: Tensor  # (N,T) bool, True = a policy token
    k: int  # samples per prompt (K)


AdvantageFn = Callable[[AdvantageInputs, Hyper], Tensor]
LossFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, "Tensor | None", Hyper], tuple[Tensor, Stats]]


@dataclass(frozen=True)
class Loss:
    fn: LossFn
    # True: it averages over the minibatch's tokens (micro-batches weigh by theirs); False: over its rows
    token_mean: bool


ADVANTAGES: dict[str, AdvantageFn] = {}
LOSSES: dict[str, Loss] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under `name` (a name is registered once)."""

    def add(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"an advantage estimator named {name!r} is already registered")
        ADVANTAGES[name] = fn
        return fn

    return add


def register_loss(name: str, *, token_mean: bool) -> Callable[[LossFn], LossFn]:
    """Decorator: register a policy loss under `name`; token_mean: see `Loss`."""

    def add(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"a loss named {name!r} is already registered")
        LOSSES[name] = Loss(fn, token_mean)
        return fn

    return add


# ---- advantages ----------------------------------------------------------------------------------


@register_advantage("leave_one_out")
def _leave_one_out(x: AdvantageInputs, hp: Hyper) -> Tensor:
    """RLOO, eq. 4 on the shaped rewards: A_i = R_i - mean_{j != i} R_j (unscored: 0, out of baselines)."""
    return leave_one_out(x.rewards.view(-1, x.k), x.valid.view(-1, x.k)).view(-1)


@register_advantage("leave_one_out_token_kl")
def _leave_one_out_token_kl(x: AdvantageInputs, hp: Hyper) -> Tensor:
    """RLOO with the KL as a per-token reward (rloo's kl_level=token) -> (N,T), 0 on padding:
        G_it = score_i - beta * sum_{s >= t} kl_is      (hp kl_estimator; the KL still to come)
        b_i  = mean_{j != i} R_j,  R_j = G_j0           (eq. 4's baseline: whole-response rewards)
        A_it = G_it - b_i
    A token is charged only the KL of itself and later tokens (earlier ones do not depend on it); at
    t = 0 this is eq. 4's advantage. Every sample must be scored (a None has no per-token rule)."""
    if not bool(x.valid.all()):
        raise RewardError(
            f"the reward function could not score {int((~x.valid).sum())} completion(s) (returned None); "
            "rloo with kl_level=token has no rule for that: use kl_level=sequence, which leaves unscored "
            "samples out of the baseline"
        )
    beta, scores = hp["beta"], x.scores.detach()
    to_go = kl_to_go(kl_per_token(x.logprobs, x.ref_logprobs, hp["kl_estimator"]), x.mask)
    totals = scores - beta * to_go[:, 0]  # R_i of eq. (1)
    baseline = totals - leave_one_out(totals.view(-1, x.k)).view(-1)  # b_i = R_i - A_i
    advantages = scores[:, None] - beta * to_go - baseline[:, None]
    return torch.where(x.mask, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))


@register_advantage("group_normalized")
def _group_normalized(x: AdvantageInputs, hp: Hyper) -> Tensor:
    """GRPO: A_i = (score_i - mean of its group) / std of its group (a constant group: 0)."""
    grouped = x.scores.view(-1, x.k)
    if x.valid.all():
        return group_normalized(grouped).view(-1)
    return group_normalized_valid(grouped, x.valid.view(-1, x.k)).view(-1)


@register_advantage("group_mean")
def _group_mean(x: AdvantageInputs, hp: Hyper) -> Tensor:
    """Dr. GRPO: A_i = score_i - mean of its group, no division by the std."""
    return group_mean_advantages(x.scores.view(-1, x.k), x.valid.view(-1, x.k)).view(-1)


@register_advantage("batch_whitened_returns")
def _batch_whitened_returns(x: AdvantageInputs, hp: Hyper) -> Tensor:
    """REINFORCE++: G_it = score_i - beta * sum_{s >= t} kl_is (hp kl_estimator), whitened over every
    real token of the kept, scored rows of the batch -> (N,T)."""
    kl = kl_per_token(x.logprobs, x.ref_logprobs, hp["kl_estimator"])
    return reinforce_pp_advantages(x.scores, kl, x.mask, hp["beta"], x.valid & x.kept)


# ---- losses --------------------------------------------------------------------------------------


def _on_policy(weights: Tensor | None, name: str) -> None:
    if weights is not None:  # rloo's registry entry refuses these settings with max_staleness / is_correction
        raise ValueError(f"the {name} loss is on-policy only (no importance weights)")


@register_loss("policy_gradient", token_mean=False)
def _policy_gradient(lp, old, ref, advantages, mask, weights, hp: Hyper):
    """RLOO's eq. 5: -1/n sum_i A_i log pi(y_i|x), the log-prob summed over the policy's tokens; with
    per-token advantages (n,T), -1/n sum_i sum_t A_it log pi(y_it|.) (``policy_gradient_loss``,
    ``sequence_sum_policy_gradient_loss``). A row mean."""
    _on_policy(weights, "policy_gradient")
    if advantages.dim() == 2:
        return sequence_sum_policy_gradient_loss(lp, advantages, mask)
    return policy_gradient_loss(sequence_logprobs(lp, mask), advantages)


@register_loss("clip_sequence", token_mean=False)
def _clip_sequence(lp, old, ref, advantages, mask, weights, hp: Hyper):
    """rloo_clip's with sequence-level KL: PPO's clipped surrogate on the whole response's ratio
    rho_i = pi(y_i|x) / pi_old(y_i|x), -1/n sum_i min(rho_i A_i, clip(rho_i, 1 +- eps) A_i) (a row mean)."""
    _on_policy(weights, "clip_sequence")
    seq, seq_old = sequence_logprobs(lp, mask), sequence_logprobs(old, mask)
    return ppo_clip_loss(seq, seq_old, advantages, clip_eps=hp["clip_eps"])


@register_loss("clip_k3", token_mean=True)
def _clip_k3(lp, old, ref, advantages, mask, weights, hp: Hyper):
    """GRPO's: the clipped surrogate + beta * k3 KL to the reference, token mean (``grpo_loss``)."""
    return grpo_loss(lp, old, ref, advantages, mask, hp["clip_eps"], hp["beta"], weights)


@register_loss("clip_k3_constant_length", token_mean=False)
def _clip_k3_constant_length(lp, old, ref, advantages, mask, weights, hp: Hyper):
    """Dr. GRPO's: as clip_k3, each completion's token terms summed and divided by one constant,
    hp norm_length or else max_new_tokens (``dr_grpo_loss``)."""
    norm_length = hp["norm_length"] or hp["max_new_tokens"]
    return dr_grpo_loss(lp, old, ref, advantages, mask, hp["clip_eps"], hp["beta"], norm_length, weights)


@register_loss("clip", token_mean=True)
def _clip(lp, old, ref, advantages, mask, weights, hp: Hyper):
    """PPO's clipped surrogate alone (no KL term: REINFORCE++ has it in the advantage), token mean,
    the advantages times the importance weights (``ppo_clip_loss``, ``weigh``)."""
    return ppo_clip_loss(lp, old, weigh(advantages, weights), mask, hp["clip_eps"])
