"""The group step: one step shared by the methods whose MethodSpec names an advantage estimator and
a policy loss (rloo.core.estimators); they differ only in those two.

  1. sample K completions per prompt and score them; the shaped reward (eq. 1) is logged
  2. advantages: the spec's estimator (None scores are left out of its statistics and get 0; with
     algorithm_settings.drop_zero_variance, groups whose scores are all equal leave the update)
  3. ppo_epochs x num_minibatches guarded steps on the spec's loss over the kept rows (one, over all
     of them, where the spec's setting that switches several updates on is off: rloo's rloo_clip)
Samples of an older policy (rl.max_staleness, rl.is_correction): decoupled, docs/async.md eq. A3 (the
ratio to the step's starting weights, every token's terms times the weight of those to the sampler's).

The built-in methods on it (rloo.config.METHOD_SPECS):
  grpo          (Shao et al. 2024, DeepSeekMath sec. 4.1) group_normalized: A_i = (score_i - mean of
                its group) / std of its group; clip_k3: clipped surrogate + beta * k3 KL, token mean
  dr_grpo       (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.2) group_mean: no
                division by the group std; clip_k3_constant_length: token terms summed and divided by
                one constant (norm_length, default max_new_tokens), not each completion's length
  reinforce_pp  (Hu 2025, REINFORCE++; OpenRLHF's `reinforce` estimator) batch_whitened_returns:
                the KL as a per-token reward-to-go, whitened over the batch; clip: the clipped
                surrogate alone, token mean
  rloo          (its ablations: kl_estimator=k3, kl_level=token, rloo_clip, drop_zero_variance; the
                paper's update itself runs in algorithms/rloo.py's one pass) leave_one_out or
                leave_one_out_token_kl; policy_gradient (eq. 5, one update per batch) or, with rloo_clip,
                clip_sequence / clip (config/methods.py's rloo_estimators picks them by the settings)
Their settings models hold clip_eps, ppo_epochs, num_minibatches, drop_zero_variance and kl_estimator
(config/method_settings.py's GRPOSettings and its relatives).
"""

from __future__ import annotations

from typing import Any

import torch

from rloo.algorithms.base import Models, StepResult
from rloo.algorithms.common import (
    Timer,
    clipped_updates,
    kept_rows,
    mean_stats,
    rollout_stats,
    sample_and_score,
    sequence_rewards,
)
from rloo.algorithms.offpolicy import floats, proximal
from rloo.config import MethodSpec, RLConfig
from rloo.core.advantages import unscored
from rloo.core.estimators import ADVANTAGES, LOSSES, AdvantageInputs
from rloo.rollout.multiturn import policy_tokens


def hyperparameters(cfg: RLConfig) -> dict[str, Any]:
    """The numbers an estimator or a loss may read: the method's own settings, beta, max_new_tokens."""
    return cfg.algorithm_settings.model_dump() | {"beta": cfg.beta, "max_new_tokens": cfg.max_new_tokens}


def clipped_group_step(spec: MethodSpec, models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    """One step of `spec`'s method: the advantage and loss its settings select (spec.estimators) by name."""
    advantage, loss_name = spec.estimators(cfg.algorithm_settings)
    assert advantage is not None and loss_name is not None, f"{spec.name} names no advantage or loss"
    # one update over every kept row where the method's switch of several updates is off (rloo's
    # rloo_clip), else its settings' ppo_epochs x num_minibatches
    switched = isinstance(spec.several_updates, str)
    one = switched and not spec.takes_several_updates(cfg.algorithm_settings.model_dump())
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    filled, valid = unscored(scores)
    old, weights, is_stats = proximal(models, roll, cfg)  # old: the sampler's log-probs on-policy
    rewards, kl = sequence_rewards(filled, roll, ref_lp, cfg, old)  # logged; a KL term is in the loss or advantage
    rows, dropped = kept_rows(scores, cfg.k, cfg.algorithm_settings.drop_zero_variance)
    kept = torch.zeros_like(valid)
    kept[rows] = True
    mask = policy_tokens(roll)  # an episode's environment tokens are not the policy's: out of every mean
    hp = hyperparameters(cfg)
    inputs = AdvantageInputs(filled, rewards, valid, kept, old, ref_lp, mask, cfg.k)
    advantages = ADVANTAGES[advantage](inputs, hp)
    loss = LOSSES[loss_name]

    def loss_fn(lp, r):
        return loss.fn(lp, old[r], ref_lp[r], advantages[r], mask[r], None if weights is None else weights[r], hp)

    passes = (1, 1) if one else None
    records, norm, skipped = clipped_updates(
        models, opt, roll, rows, loss_fn, cfg, gen, passes, token_mean=loss.token_mean
    )
    timer.lap("update")
    stats = mean_stats(records)
    if advantages.dim() == 1:  # one per completion: shown in the sample table, its spread logged
        roll.record(advantage=advantages)
        stats.setdefault("adv/std", advantages.std().item())  # eq. 5's loss logs its own (its rows')
    stats |= {"groups/dropped": float(dropped)} | floats(is_stats)
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, norm, skipped, timer), roll, rewards)
