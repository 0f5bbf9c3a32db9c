"""A sampler that lags the trainer by N updates, in the trainer's own process (rl.max_staleness = N):
the deterministic, synchronous simulation of the asynchronous producer
(rloo.rollout.producer). The batch of step t is sampled with exactly the weights of update
max(0, t - N) (rloo.runtime.link.weights.WeightRing), so the off-policy estimator is exercised end to
end with the same staleness as the producer process, without its overlap (no speed-up).

Used as `Models.sampler`: `__call__(policy, prompts)` samples, `sync(policy)` is called by the
loop after each update and publishes the new weights. Batch t draws from its own generator
(`batch_generator(seed, t)`), as the producer's does: a resumed run, its ring refilled from the
checkpoint (`older`), samples the same batches bit for bit.
"""

from __future__ import annotations

import copy

import torch

from rloo.config import RLConfig
from rloo.rollout.sampler import Rollout
from rloo.rollout.versioned import VersionSampler
from rloo.runtime.checkpoint.rng import batch_generator
from rloo.runtime.link.weights import WeightRing


def shadow_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of `policy` to sample with (its weights are overwritten from the ring)."""
    shadow = copy.deepcopy(policy)
    for p in shadow.parameters():
        p.requires_grad_(False)
    return shadow


class LaggedSampler:
    def __init__(self, policy: torch.nn.Module, tokenizer, cfg: RLConfig, version: int = 0, older=None):
        self.tokenizer, self.cfg = tokenizer, cfg
        self.lag = cfg.max_staleness
        self.shadow = shadow_copy(policy)
        self.sample = VersionSampler(cfg, tokenizer)  # rloo's sampler, or vLLM (generation=vllm)
        # steps the trainer has made (= the next batch's index); a resumed run starts at its step
        # with its checkpoint's older versions (WeightRing.older_versions)
        self.version = version
        self.ring = WeightRing(policy, cfg.ring_lag, version=version)
        self.ring.refill(older or {}, policy, version)

    def behaviour_version(self) -> int:
        """The weights the next batch is sampled with: N updates ago, or the oldest the ring has
        (a resumed run's checkpoint without them: one from before exact resume)."""
        return max(self.version - self.lag, self.ring.oldest())

    def __call__(self, policy: torch.nn.Module, prompts: list[str], rows=None, generator=None) -> Rollout:
        """`rows`: this process's rows of the global batch (torchrun; `rollout`): the same tokens on any
        number of processes. None (a step that passes none: every method but plain rloo): the whole
        batch's, which the producer always samples with (`Dist.shard`), so both draw the same tokens."""
        rows = rows if rows is not None else (0, len(prompts) * self.cfg.k)
        v = self.behaviour_version()
        self.ring.load_into(v, self.shadow)
        roll = self.sample(self.shadow, v, prompts, batch_generator(self.cfg.seed, self.version), rows)
        roll.lag = self.version - v
        return roll

    def part_metrics(self) -> dict[str, float]:
        """vLLM's mismatch with the lagged policy on the last batch (generation=vllm); else nothing."""
        return self.sample.part_metrics()

    def sync(self, policy: torch.nn.Module) -> None:
        self.version += 1
        self.ring.publish(self.version, policy)
