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

from rloo.algorithms.agents import sample_episodes
from rloo.algorithms.base import Models, guarded_step, rollout_logprobs, score_rollout
from rloo.algorithms.offpolicy import loo_advantages, off_policy_loss
from rloo.config import RLConfig
from rloo.core.advantages import unscored, zero_variance_groups
from rloo.core.kl import shaped_reward
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss
from rloo.errors import EnvError
from rloo.modeling.forward import completion_logprobs
from rloo.rollout import rollout
from rloo.rollout.multiturn import policy_tokens
from rloo.runtime.distributed import is_wrapped, unwrap


def scored_mean(scores: torch.Tensor) -> float:
    """Mean of the scored samples (a None score is NaN); 0 when none was scored (reward/unscored = 1)."""
    filled, valid = unscored(scores)
    return (filled.sum() / valid.sum().clamp(min=1)).item()


def group_stats(scores: torch.Tensor, k: int) -> dict[str, float]:
    """groups/zero_variance: share of prompts whose k scores (the scored ones) are all equal, the
    groups no group baseline draws a gradient from; reward/unscored: share of None scores (NaN)."""
    _, valid = unscored(scores)
    out = {"reward/unscored": 1.0 - valid.float().mean().item()}
    if k > 1:
        out["groups/zero_variance"] = zero_variance_groups(scores.view(-1, k), valid.view(-1, k)).float().mean().item()
    return out


def sample(
    models: Models,
    prompts: list[str],
    cfg: RLConfig,
    gen: torch.Generator,
    rows=None,
    all_done=None,
    keep_prefill: bool = False,
):
    """Step 1 of every online method: K completions per prompt with the sampled tokens' log-probs,
    from the configured sampler (generation=vllm) or rloo's own rollout. keep_prefill: keep the
    graph-carrying prompt pass for the update to reuse (rloo_step's fast path; see `rollout`)."""
    if models.env is not None:
        raise EnvError(f"algorithm={cfg.algorithm} does not train on multi-turn environments; use algorithm=rloo")
    if models.sampler is not None:
        return models.sampler(unwrap(models.policy), prompts)
    return rollout(
        unwrap(models.policy),
        models.tokenizer,
        prompts,
        cfg.k,
        max_prompt_len=cfg.max_prompt_tokens,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        generator=gen,
        share_prompt=cfg.share_prompt,
        keep_prefill=keep_prefill,
        rows=rows,
        all_done=all_done,
    )


def keeps_prefill(models: Models, cfg: RLConfig) -> bool:
    """Should sampling keep the graph-carrying prompt pass for the update (`update_logprobs`) to reuse:
    with share_prompt, unless the policy is DDP/FSDP-wrapped (its update must be one forward through
    the wrapper)."""
    return cfg.share_prompt and not is_wrapped(models.policy)


def update_logprobs(models: Models, roll, cfg: RLConfig) -> torch.Tensor:
    """Per-token log-probs (N, T) of the sampled completions under the policy, with the graph for the
    backward pass: through the DDP/FSDP wrapper when there is one, else reusing the rollout's
    prompt pass where it kept one."""
    if not is_wrapped(models.policy):
        return rollout_logprobs(models.policy, roll, cfg, prefill=roll.prefill)
    return completion_logprobs(
        models.policy,
        roll.prompt_ids,
        roll.prompt_mask,
        roll.completion_ids,
        roll.completion_mask,
        temperature=cfg.temperature,
        max_logits_mb=cfg.max_logits_mb,
    )


def rloo_step(
    models: Models,
    opt,
    prompts: list[str],
    cfg: RLConfig,
    gen: torch.Generator,
    rows: tuple[int, int] | None = None,
    all_done=None,
):
    """One RLOO update on `prompts`. Returns (stats dict, rollout, shaped rewards (N,)); the
    optimizer step is skipped (and counted) when the loss or the gradient is not finite.
    Under torchrun `prompts` is this process's share and `rows`/`all_done` come from
    rloo.runtime.distributed (see `rollout`); DDP/FSDP average the gradient over processes."""
    t0 = time.perf_counter()
    # 1. sample K completions per prompt, with the log-probs of the sampled tokens (and the prompt
    # pass kept for the update where it can be reused)
    if models.env is not None:  # multi-turn episodes: the loss, KL and lengths count the policy's tokens only
        roll = sample_episodes(models, prompts, cfg, gen, rows)
    else:
        roll = sample(models, prompts, cfg, gen, rows, all_done, keep_prefill=keeps_prefill(models, cfg))
    mask = policy_tokens(roll)
    t1 = time.perf_counter()
    # 2. score, and the frozen reference's log-probs
    scores, ref_lp = score_rollout(models, roll, cfg)
    t2 = time.perf_counter()
    # 3. shaped reward (eq. 1) and leave-one-out advantages (eq. 4); a None score (NaN) is left out
    # of its group's baselines and gets advantage 0
    filled, valid = unscored(scores)
    if cfg.off_policy_correction is None:  # the paper's on-policy update
        rewards, kl = shaped_reward(filled, roll.logprobs, ref_lp, mask, cfg.beta)
        advantages = loo_advantages(rewards, valid, cfg.k)
        # 4. REINFORCE on the whole response (eq. 5)
        logprobs = update_logprobs(models, roll, cfg)
        loss, stats = policy_gradient_loss(sequence_logprobs(logprobs, mask), advantages)
    else:  # 3-4 for samples of another policy: importance-weighted (algorithms/offpolicy.py, docs/async.md);
        # single-turn only (RLConfig refuses env= with max_staleness or is_correction)
        logprobs = update_logprobs(models, roll, cfg)
        loss, stats, rewards, kl, advantages = off_policy_loss(logprobs, roll, filled, valid, ref_lp, cfg)
    roll.record(score=scores, kl=kl, advantage=advantages)
    roll.prefill = None  # its graph is consumed by this backward pass; do not hold it past the step
    grad_norm, finite = guarded_step(loss, models.policy.parameters(), opt, cfg.max_grad_norm)
    t3 = time.perf_counter()
    times = {"time/rollout": t1 - t0, "time/score": t2 - t1, "time/update": t3 - t2}
    stats = {k: float(v) for k, v in stats.items()} | step_stats(roll, scores, kl, rewards, grad_norm, finite, cfg.k)
    return stats | times, roll, rewards


def step_stats(roll, scores, kl, rewards, grad_norm: float, finite: bool, k: int) -> dict[str, float]:
    """The logged numbers of one step besides the loss's own and the phase times."""
    lengths = policy_tokens(roll).sum(-1).float()
    return (
        group_stats(scores, k)
        | getattr(roll, "env_stats", {})
        | {
            "reward/score": scored_mean(scores),
            "reward/kl": kl.mean().item(),
            "reward/total": rewards.mean().item(),
            "kl/ref": kl.mean().item(),
            "grad/norm": grad_norm,
            "gen/length": lengths.mean().item(),
            "gen/truncated": roll.truncated.float().mean().item(),
            "guard/skipped": float(not finite),
            "data/prompts_truncated": float(roll.prompts_truncated),
        }
    )
