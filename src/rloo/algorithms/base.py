"""What every algorithm works with: the models of a run, the Algorithm protocol, scoring a
rollout, and the guarded optimizer step (the one place a non-finite update is skipped).

A step has the signature
    step(models, opt, prompts, cfg, gen, **kw) -> StepResult (stats, Rollout, shaped rewards (N,))
so the shared loop (rloo.training.loop) does not know which method it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from rloo.config import RLConfig, RLSettings
from rloo.core.accumulation import weighted_stats
from rloo.core.truncation import Truncation
from rloo.envs import EnvSpec
from rloo.modeling.logprob_pass import policy_logprobs
from rloo.modeling.lora import AdapterDisabled
from rloo.rewards import RewardSource
from rloo.rollout import Rollout
from rloo.rollout.capabilities import PreScoredRollout, Sampler
from rloo.runtime.distributed import full_tensor, gradient_sync

# (policy, prompts, rows=None) -> Rollout: vLLM, or the lagged samplers of rl.max_staleness (rows: see
# rloo.runtime.distributed.Dist.shard)


@dataclass
class Models:
    """The models of one run. `scorer` is None only for DPO without a reward model (it never scores)."""

    policy: torch.nn.Module  # trainable; under torchrun wrapped by DDP/FSDP
    ref: torch.nn.Module | AdapterDisabled  # frozen reference (the starting policy; under LoRA its adapters off)
    tokenizer: PreTrainedTokenizerBase
    scorer: RewardSource | None  # the reward source
    sampler: Sampler | None = None  # optional generation backend (vLLM); None: rloo's sampler
    env: EnvSpec | None = None  # multi-turn episodes instead of single responses (rloo.algorithms.agents)


# The keys of the stats every step logs that the loop reads (written by common.step_stats).
SCORE, KL, SKIPPED = "reward/score", "reward/kl", "guard/skipped"


@dataclass
class StepResult:
    """What a step returns: `stats`, every number it logs (one dict per step, the loss's, the
    method's own, `step_stats`' and the phase times), the rollout, and its shaped rewards (N,).
    The loop reads the score, the KL and whether the update was skipped through the properties."""

    stats: dict[str, float]
    rollout: Rollout
    rewards: Tensor

    @property
    def score(self) -> float:
        """Mean score of the scored samples."""
        return self.stats[SCORE]

    @property
    def kl(self) -> float:
        """Mean KL to the reference policy (of the shaped reward)."""
        return self.stats[KL]

    @property
    def skipped(self) -> bool:
        """No update was made (non-finite loss or gradient, or an update undone by the weight guard)."""
        return bool(self.stats[SKIPPED])


class Algorithm(Protocol):
    """What the loop needs of a method. `distributed`: the step may run under torchrun; it then
    takes `rows` (this process's rows of the global batch) and `all_done` (a shared stop under
    FSDP) and the checkpoint holds no per-process state."""

    distributed: bool

    def step(
        self, models: Models, opt: torch.optim.Optimizer, prompts: list[str], cfg: RLConfig, gen: torch.Generator
    ) -> StepResult:
        """One update on `prompts` (this process's share under torchrun, where a `distributed`
        step also takes rows= and all_done=): its stats, the rollout, shaped rewards (N,)."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class ValueModel(Protocol):
    """A learned value function's trainable parameters and its own optimizer."""

    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer


@runtime_checkable
class LearnsValues(Protocol):
    """An algorithm that trains a value model beside the policy (ppo, vanilla_pg): the loop's weight
    guard watches its parameters and optimizer too."""

    value: ValueModel


class Stateless:
    """An algorithm whose step keeps nothing between batches (RLOO, GRPO, RAFT)."""

    def __init__(self, step: Callable, distributed: bool = False):
        self.step, self.distributed = step, distributed

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def policy_truncation(cfg: RLSettings) -> Truncation | None:
    """The truncation of the policy's trained log-probs: the sampler's top_k/top_p under
    rl.logprobs_under=truncated (rloo.core.truncation), else None (the full distribution)."""
    return Truncation.of(cfg) if cfg.truncated_logprobs else None


def rollout_logprobs(
    model, roll: Rollout, cfg: RLSettings, prefill=None, policy: bool = True, rows=None, wrapped: bool = False
) -> Tensor:
    """log pi(y_t|x, y_<t) of the rollout's tokens under `model` (N,T), or of its rows `rows` (n,) in
    that order: `rloo.modeling.logprob_pass.policy_logprobs`, which picks the pass (shared when
    cfg.share_prompt, reusing `prefill`, the policy's prompt pass kept from sampling; plain when
    `wrapped` by DDP/FSDP). policy: the policy's log-probs, of the sampler's truncated distribution
    where cfg says so; False: a frozen model's (the reference: always the full distribution, so
    KL(pi_K || pi_ref) stays finite)."""
    truncation = policy_truncation(cfg) if policy else None
    return policy_logprobs(
        model,
        roll.prompt_ids,
        roll.prompt_mask,
        roll.completion_ids,
        roll.completion_mask,
        k=roll.group_size,
        share=cfg.share_prompt,
        wrapped=wrapped,
        prefill=prefill,
        rows=rows,
        temperature=cfg.temperature,
        max_logits_mb=cfg.max_logits_mb,
        truncation=truncation,
    )


def rows_logprobs(model, roll: Rollout, rows: Tensor, cfg: RLConfig, wrapped: bool = False) -> Tensor:
    """log pi of the rollout's rows `rows` (n,) -> (n,T), in that order: a minibatch of a method that
    takes several updates per batch (`rollout_logprobs`: shared when they are whole groups)."""
    return rollout_logprobs(model, roll, cfg, rows=rows, wrapped=wrapped)


class Scoring:
    """Step 2 of a step: reward-source scores (N,) with the truncation penalty applied, and the frozen
    reference's log-probs (N,T). Picklable with its models: the asynchronous rollout producer
    (rl.max_staleness > 0, docs/async.md) runs this same code where it samples."""

    def __init__(self, scorer: RewardSource, ref, cfg: RLConfig):
        # ref None: set by the producer (under LoRA, its own policy copy with the adapters off)
        self.scorer, self.ref, self.cfg = scorer, ref, cfg

    def __call__(self, roll: Rollout) -> tuple[Tensor, Tensor]:
        scores = self.scorer(roll).to(roll.logprobs.device)
        if self.cfg.truncation_penalty is not None:
            scores = torch.where(roll.truncated, torch.full_like(scores, self.cfg.truncation_penalty), scores)
        with torch.no_grad():
            ref_lp = rollout_logprobs(self.ref, roll, self.cfg, policy=False)
        return scores, ref_lp

    def part_metrics(self) -> dict[str, float]:
        return self.scorer.part_metrics()


def score_rollout(models: Models, roll: Rollout, cfg: RLConfig) -> tuple[Tensor, Tensor]:
    """Reward-source scores (N,) with the truncation penalty applied, and reference log-probs (N,T);
    those the rollout producer computed with `Scoring` where the batch carries them (`scored`)."""
    assert models.scorer is not None, "an online method needs a reward source"
    scored = roll.scored if isinstance(roll, PreScoredRollout) else None  # rloo.rollout.producer.ScoredRollout
    if scored is not None:
        return scored
    return Scoring(models.scorer, models.ref, cfg)(roll)


def total(norm: Tensor) -> Tensor:
    """The whole gradient norm from clip_grad_norm_. Under FSDP2 it is a DTensor, which torch 2.7-2.9
    return partial (each process's share: float() of it read 1.65 on one process where the total
    was 1.86); torch 2.13 returns it replicated. Clipping itself used the full value (torch 2.9: the
    parameters matched one process); this makes the logged norm and the finiteness check (the same on
    every process) use it too."""
    return full_tensor(norm)


class Accumulated:
    """The backward passes of one update split in micro-batches (rloo.core.accumulation), given to
    `guarded_step` in place of a loss. loss_of(part) -> (loss, stats): a micro-batch's loss, a mean
    over its units, whose backward is scaled by the part's share, so the summed gradient is the
    whole batch's. Intermediate passes skip DDP/FSDP's gradient reduction (`gradient_sync`); the
    last one reduces the sum. After the call: `loss` (the batch's, detached), `stats` (weighted)."""

    def __init__(self, parts: list, shares: list[float], loss_of: Callable, model=None):
        self.parts, self.shares, self.loss_of, self.model = parts, shares, loss_of, model
        self.loss, self.stats = torch.tensor(float("nan")), {}

    def __call__(self) -> Tensor:
        """Run the backward passes; a 0-dim bool tensor, True when every micro-batch's loss was finite. It
        stays on the device: `guarded_step` reads it once with the gradient's check (reading it after each
        micro-batch made the host wait for that backward before queueing the next forward, on a GPU)."""
        finite, records = [], []
        for i, (part, share) in enumerate(zip(self.parts, self.shares, strict=True)):
            with gradient_sync(self.model, i == len(self.parts) - 1):
                loss, stats = self.loss_of(part)
                (loss * share).backward()
            finite.append(torch.isfinite(loss.detach()))
            records.append(stats | {"loss": loss.detach()})
        self.stats = weighted_stats(records, self.shares)
        self.loss = self.stats.pop("loss")
        return torch.stack(finite).all()


def guarded_step(
    loss: Tensor | Accumulated, params, opt: torch.optim.Optimizer, max_grad_norm: float
) -> tuple[float, bool]:
    """Backward (of one loss, or of an update's micro-batches), clip the whole gradient, and step
    only when the loss(es) and the gradient are finite. (grad norm, stepped).
    A skipped step is counted by the loop's NonFiniteGuard (rloo.training.guard)."""
    opt.zero_grad(set_to_none=True)
    if isinstance(loss, Accumulated):
        loss_finite = loss()
    else:
        loss.backward()
        loss_finite = torch.isfinite(loss.detach())
    grad_norm = total(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    # one host read for both checks: on a GPU the clip's kernels queue behind the backward instead of
    # being launched only once the host has waited for it (the values, and so the decision, are the same)
    finite = bool(loss_finite & torch.isfinite(grad_norm))
    if finite:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return float(grad_norm), finite
