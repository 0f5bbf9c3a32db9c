"""A sampler that lags the trainer by N updates, in the trainer's own process (rl.max_staleness = N):
the deterministic, synchronous simulation of the asynchronous producer
(rloo.rollout.producer). The batch of step t is sampled with exactly the weights of update
max(0, t - N) (rloo.runtime.weights.WeightRing), so the off-policy estimator is exercised end to
end with the same staleness as the producer process, without its overlap (no speed-up).

Used as `Models.sampler`: `__call__(policy, prompts)` samples, `sync(policy)` is called by the
loop after each update and publishes the new weights.
"""

from __future__ import annotations

import copy

import torch

from rloo.config import RLConfig
from rloo.rollout.sampler import Rollout, rollout
from rloo.rollout.settings import sampling_settings
from rloo.runtime.weights import WeightRing


def shadow_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of `policy` to sample with (its weights are overwritten from the ring)."""
    shadow = copy.deepcopy(policy)
    for p in shadow.parameters():
        p.requires_grad_(False)
    return shadow


class LaggedSampler:
    def __init__(self, policy: torch.nn.Module, tokenizer, cfg: RLConfig, generator: torch.Generator, version=0):
        self.tokenizer, self.cfg, self.generator = tokenizer, cfg, generator
        self.lag = cfg.max_staleness
        self.shadow = shadow_copy(policy)
        # updates the trainer has made; a resumed run starts at its step with only those weights
        self.version = version
        self.ring = WeightRing(policy, self.lag, version=version)

    def behaviour_version(self) -> int:
        """The weights the next batch is sampled with: N updates ago, or the oldest the ring has."""
        oldest = max(0, self.version - self.lag)
        return max(oldest, min(int(v) for v in self.ring.versions if v >= 0))

    def __call__(self, policy: torch.nn.Module, prompts: list[str]) -> Rollout:
        v = self.behaviour_version()
        self.ring.load_into(v, self.shadow)
        cfg = self.cfg
        roll = rollout(
            self.shadow,
            self.tokenizer,
            prompts,
            cfg.k,
            **sampling_settings(cfg),
            generator=self.generator,
        )
        roll.lag = self.version - v
        return roll

    def sync(self, policy: torch.nn.Module) -> None:
        self.version += 1
        self.ring.publish(self.version, policy)
