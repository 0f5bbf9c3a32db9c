"""RAFT: reward-ranked fine-tuning (Dong et al. 2023), as compared in Ahmadian et al. 2024.

  1. sample K completions per prompt, score them, shaped reward R (eq. 1)
  2. keep the highest-reward completion of each prompt (best-of-K, `raft_select`)
  3. one supervised step on the kept completions: token-averaged negative log-likelihood (of an
     episode, the policy's tokens only: the environment's observations are not imitated)
The other K-1 samples only serve to rank; nothing is pushed down.
Samples of an older policy (rl.max_staleness): trained on as they are, ranked by the sampler's shaped
reward, with no importance weight (best-of-k has no tractable ratio; docs/async.md).
"""

from __future__ import annotations

import torch

from rloo.algorithms.base import Accumulated, Models, StepResult, guarded_step, rows_logprobs
from rloo.algorithms.common import (
    Timer,
    micro_parts,
    require_scored,
    rollout_stats,
    sample_and_score,
    sequence_rewards,
    step_loss_stats,
)
from rloo.algorithms.offpolicy import as_sampled_stats
from rloo.config import RLConfig
from rloo.core.accumulation import micro_shares
from rloo.core.losses import raft_select, sft_loss
from rloo.rollout.multiturn import policy_tokens
from rloo.runtime.distributed import is_wrapped


def raft_rows(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Rows (B,) of the best completion of each prompt in a (N,) reward vector grouped by prompt."""
    best = raft_select(rewards.view(-1, k))
    return torch.arange(best.shape[0], device=rewards.device) * k + best


def raft_step(models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    require_scored(scores, cfg.algorithm)
    rewards, kl = sequence_rewards(scores, roll, ref_lp, cfg)
    rows = raft_rows(rewards, cfg.k)
    # one row per prompt (never whole groups): the plain pass, through the DDP/FSDP wrapper if any;
    # rl.micro_batch_size prompts' rows per pass, weighed by their tokens (sft_loss's mean)
    wrapped, mask = is_wrapped(models.policy), policy_tokens(roll)  # an episode's own tokens only

    def loss_of(r):
        lp = rows_logprobs(models.policy, roll, r, cfg, wrapped)
        loss, stats = sft_loss(lp, mask[r])
        return loss, stats | ({} if cfg.off_policy_correction is None else as_sampled_stats(lp, roll, r, cfg))

    parts = micro_parts(rows, cfg, per_prompt=1)
    loss, stats = (
        loss_of(rows)
        if len(parts) == 1
        else (Accumulated(parts, micro_shares(parts, mask), loss_of, models.policy), {})
    )
    grad_norm, stepped = guarded_step(loss, list(models.policy.parameters()), opt, cfg.max_grad_norm)
    timer.lap("update")
    stats = step_loss_stats(loss, stats) | {"raft/kept_reward": rewards[rows].mean().item()}
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, grad_norm, not stepped, timer), roll, rewards)
