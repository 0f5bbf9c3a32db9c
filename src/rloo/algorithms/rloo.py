"""RL fine-tuning with REINFORCE Leave-One-Out (Ahmadian et al. 2024), seed eq. (1), (4), (5).

One step:
  1. sample K completions for each of B prompts, keeping the sampled tokens' log-probs
  2. score them (reward model or function) and compute the reference log-probs
  3. shaped reward R = r - beta * sum_t log(pi/pi_ref) (eq. 1); leave-one-out advantage (eq. 4)
  4. one policy-gradient step on the whole response: -mean_i A_i log pi(y_i|x) (eq. 5)
No value model, no ratio to an old policy, no clipping: each update uses fresh samples.
Steps 3-4 are the registered estimators rloo's MethodSpec names (rloo.core.estimators: the
`leave_one_out` advantage, the `policy_gradient` loss), here in one pass over every row that reuses the
sampler's prompt pass; its ablations (kl_level=token, k3, rloo_clip, drop_zero_variance) run the
same table's estimators in the group step (algorithms/clipped_group.py).
tests/equivalence/test_rloo_registered.py pins this step to that path.
"""

from __future__ import annotations

import time

import torch

from rloo.algorithms.base import Models, StepResult, guarded_step, score_rollout, update_logprobs
from rloo.algorithms.common import (
    keeps_prefill,
    policy_gradient_update,
    sample_rollout,
    step_loss_stats,
    step_stats,
)
from rloo.algorithms.offpolicy import off_policy_loss
from rloo.config import RLConfig
from rloo.core.advantages import leave_one_out, unscored
from rloo.core.kl import shaped_reward
from rloo.rollout.multiturn import policy_tokens


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
    # (or multi-turn episodes: the loss, KL and lengths count the policy's tokens only)
    keep = keeps_prefill(models, cfg, len(prompts))
    roll = sample_rollout(models, prompts, cfg, gen, rows, all_done, keep_prefill=keep)
    mask = policy_tokens(roll)
    t1 = time.perf_counter()
    # 2. score, and the frozen reference's log-probs
    scores, ref_lp = score_rollout(models, roll, cfg)
    t2 = time.perf_counter()
    # 3. shaped reward (eq. 1) and leave-one-out advantages (eq. 4); a None score (NaN) is left out
    # of its group's baselines and gets advantage 0. For samples of another policy (rl.max_staleness,
    # rl.is_correction; single-turn only, RLConfig refuses env= with them) eq. A1: the KL is the
    # trained policy's, from the update's log-probs (algorithms/offpolicy.py, docs/async.md)
    filled, valid = unscored(scores)
    logprobs = None if cfg.off_policy_correction is None else update_logprobs(models, roll, cfg)
    kl_logprobs = roll.logprobs if logprobs is None else logprobs.detach()
    rewards, kl = shaped_reward(filled, kl_logprobs, ref_lp, mask, cfg.beta)
    advantages = leave_one_out(rewards.view(-1, cfg.k), valid.view(-1, cfg.k)).view(-1)
    if logprobs is None:  # 4. the paper's update: REINFORCE on the whole response (eq. 5), in micro-batches
        # of whole groups when rl.micro_batch_size splits the batch (the baseline above saw every group whole)
        loss, stats = policy_gradient_update(models, roll, mask, advantages, cfg)
    else:  # 4. importance-weighted (eq. A2, A4)
        loss, stats = off_policy_loss(logprobs, roll, valid, rewards, kl, advantages, cfg)
    roll.record(score=scores, kl=kl, advantage=advantages)
    roll.prefill = None  # its graph is consumed by this backward pass; do not hold it past the step
    grad_norm, finite = guarded_step(loss, models.policy.parameters(), opt, cfg.max_grad_norm)
    t3 = time.perf_counter()
    times = {"time/rollout": t1 - t0, "time/score": t2 - t1, "time/update": t3 - t2}
    stats = step_loss_stats(loss, stats) | step_stats(roll, scores, kl, rewards, grad_norm, finite, cfg.k)
    return StepResult(stats | times, roll, rewards)
