"""REINFORCE with a moving-average baseline (Williams 1992; Ahmadian et al. 2024 eq. 3).

The whole response is one action, as in RLOO, but the baseline is a running average of past
rewards instead of the other samples of the same prompt:
  1. sample K completions per prompt, score them, shaped reward R (eq. 1)
  2. A_i = R_i - b, with b the moving average of earlier batches' rewards (eq. 3)
  3. one policy-gradient step on -mean_i A_i log pi(y_i|x) (eq. 5's loss)
  4. b <- m * b + (1 - m) * mean(R)
Samples of an older policy (rl.max_staleness, rl.is_correction; docs/async.md): R with the current
policy's KL (eq. A1), the loss importance-weighted (eq. A2), and step 4 averages the behaviour
samples' R unweighted (the baseline tracks the lagged policies' reward: still independent of the
batch's samples, so a valid baseline).
The baseline is state: it is saved in checkpoints (state_dict) so a resumed run continues it.
"""

from __future__ import annotations

import torch

from rloo.algorithms.base import Models, StepResult, guarded_step, update_logprobs
from rloo.algorithms.common import (
    Timer,
    keeps_prefill,
    policy_gradient_update,
    require_scored,
    rollout_stats,
    sample_and_score,
    sequence_rewards,
    step_loss_stats,
)
from rloo.algorithms.offpolicy import current_rewards, weighted_loss
from rloo.config import RLConfig
from rloo.core.advantages import moving_average_advantages, moving_average_update
from rloo.rollout.multiturn import policy_tokens


class Reinforce:
    distributed = False  # its moving-average baseline is per process

    def __init__(self, cfg: RLConfig):
        self.momentum = cfg.algorithm_settings.baseline_momentum
        self.estimator = cfg.algorithm_settings.kl_estimator
        self.baseline: torch.Tensor | None = None  # None until the first batch has been seen

    def state_dict(self) -> dict:
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        self.baseline = state.get("baseline")

    def step(self, models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
        timer = Timer()
        keep = keeps_prefill(models, cfg, len(prompts))
        roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer, keep)
        require_scored(scores, cfg.algorithm)
        # samples of another policy: the update's pass first, its log-probs give the current KL (eq. A1)
        logprobs = None if cfg.off_policy_correction is None else update_logprobs(models, roll, cfg)
        if logprobs is None:
            rewards, kl = sequence_rewards(scores, roll, ref_lp, cfg)
        else:
            rewards, kl = current_rewards(logprobs, scores, ref_lp, roll.completion_mask, cfg, self.estimator)
            roll.record(score=scores, kl=kl)
        # The first batch has no past: it is centred on its own mean (a one-off warm start),
        # afterwards the baseline only holds earlier batches, so it is independent of the samples.
        baseline = rewards.mean() if self.baseline is None else self.baseline
        advantages = moving_average_advantages(rewards, baseline)
        roll.record(advantage=advantages)
        # rloo's update pass (shared prompts, the sampling's prompt pass reused): only the baseline differs
        if logprobs is None:
            loss, stats = policy_gradient_update(models, roll, policy_tokens(roll), advantages, cfg)
        else:  # eq. A2 (single-turn only: RLConfig refuses env= with max_staleness or is_correction)
            loss, stats = weighted_loss(logprobs, roll, advantages, cfg)
        roll.prefill = None  # its graph is consumed by this backward pass
        grad_norm, stepped = guarded_step(loss, list(models.policy.parameters()), opt, cfg.max_grad_norm)
        if stepped:  # a skipped (non-finite) step changes nothing, or NaN rewards would poison the baseline
            self.baseline = moving_average_update(baseline, rewards, self.momentum)
        timer.lap("update")
        stats = step_loss_stats(loss, stats) | {"reinforce/baseline": float(baseline)}
        stats |= rollout_stats(roll, scores, kl, rewards, grad_norm, not stepped, timer)
        return StepResult(stats, roll, rewards)
