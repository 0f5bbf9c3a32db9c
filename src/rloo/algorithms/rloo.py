"""RL fine-tuning with REINFORCE Leave-One-Out (Ahmadian et al. 2024), seed eq. (1), (4), (5).

One step:
  1. sample K completions for each of B prompts, keeping the sampled tokens' log-probs
  2. score them (reward model or function) and compute the reference log-probs
  3. shaped reward R = r - beta * sum_t log(pi/pi_ref) (eq. 1); leave-one-out advantage (eq. 4)
  4. one policy-gradient step on the whole response: -mean_i A_i log pi(y_i|x) (eq. 5)
No value model, no ratio to an old policy, no clipping: each update uses fresh samples.
"""

from __future__ import annotations

import time

import torch

from rloo.algorithms.base import Models, StepResult, guarded_step, score_rollout
from rloo.algorithms.common import keeps_prefill, sample, step_stats, update_logprobs
from rloo.config import RLConfig
from rloo.core.advantages import leave_one_out, leave_one_out_valid, unscored
from rloo.core.kl import shaped_reward
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss


def rloo_step(
    models: Models,
    opt,
    prompts: list[str],
    cfg: RLConfig,
    gen: torch.Generator,
    rows: tuple[int, int] | None = None,
    all_done=None,
):
    """One RLOO update on `prompts`. Returns a StepResult (stats, rollout, shaped rewards (N,)); the
    optimizer step is skipped (and counted) when the loss or the gradient is not finite.
    Under torchrun `prompts` is this process's share and `rows`/`all_done` come from
    rloo.runtime.distributed (see `rollout`); DDP/FSDP average the gradient over processes."""
    t0 = time.perf_counter()
    # 1. sample K completions per prompt, with the log-probs of the sampled tokens (and the prompt
    # pass kept for the update where it can be reused)
    roll = sample(models, prompts, cfg, gen, rows, all_done, keep_prefill=keeps_prefill(models, cfg))
    t1 = time.perf_counter()
    # 2. score, and the frozen reference's log-probs
    scores, ref_lp = score_rollout(models, roll, cfg)
    t2 = time.perf_counter()
    # 3. shaped reward (eq. 1) and leave-one-out advantages (eq. 4); a None score (NaN) is left out
    # of its group's baselines and gets advantage 0
    filled, valid = unscored(scores)
    rewards, kl = shaped_reward(filled, roll.logprobs, ref_lp, roll.completion_mask, cfg.beta)
    grouped = rewards.view(-1, cfg.k)
    advantages = leave_one_out(grouped) if valid.all() else leave_one_out_valid(grouped, valid.view(-1, cfg.k))
    advantages = advantages.view(-1)
    roll.record(score=scores, kl=kl, advantage=advantages)
    # 4. REINFORCE on the whole response (eq. 5)
    logprobs = update_logprobs(models, roll, cfg)
    roll.prefill = None  # its graph is consumed by this backward pass; do not hold it past the step
    loss, stats = policy_gradient_loss(sequence_logprobs(logprobs, roll.completion_mask), advantages)
    grad_norm, finite = guarded_step(loss, models.policy.parameters(), opt, cfg.max_grad_norm)
    t3 = time.perf_counter()
    times = {"time/rollout": t1 - t0, "time/score": t2 - t1, "time/update": t3 - t2}
    stats = {k: float(v) for k, v in stats.items()} | step_stats(roll, scores, kl, rewards, grad_norm, finite, cfg.k)
    return StepResult(stats | times, roll, rewards)
