"""What a generation backend, a rollout and an episode's environment may offer beyond the required, as
protocols: the loop and the steps ask `isinstance(x, Protocol)` (a run-time check of the members)
instead of guessing with getattr, and the type checker holds each implementation to the signatures
written here."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from rloo.rollout.sampler import Rollout


class Sampler(Protocol):
    """A generation backend (rloo.rollout.vllm, the asynchronous producer, its in-process lag): K
    completions per prompt in the layout of rloo.rollout.sampler, and a copy of the trained weights
    taken after each step. `rows`: this process's rows of the global batch under torchrun; `generator`:
    the run's generator, which seeds an engine's requests where it draws its own numbers (vLLM: exact
    resume); a backend that samples with the weights' own stream ignores it."""

    def __call__(
        self, policy: torch.nn.Module, prompts: list[str], rows=None, generator: torch.Generator | None = None
    ) -> Rollout: ...

    def sync(self, policy: torch.nn.Module) -> None: ...


@runtime_checkable
class ReportsMetrics(Protocol):
    """A backend with numbers of its own to log after each step (the producer's queue and lag)."""

    def part_metrics(self) -> dict[str, float]: ...


def part_metrics(backend: object) -> dict[str, float]:
    """A backend's own numbers for the step's metrics; {} from one without (not ReportsMetrics)."""
    return backend.part_metrics() if isinstance(backend, ReportsMetrics) else {}


@runtime_checkable
class Closable(Protocol):
    """A backend holding a process or a connection that ends with the run."""

    def close(self) -> None: ...


@runtime_checkable
class KeepsStats(Protocol):
    """An episode's environment that counts what happened in it (rloo.envs.CheckedEnv: tool calls and
    tool errors, when the user's environment keeps them)."""

    def stats(self) -> dict[str, float]: ...


@runtime_checkable
class NamesItsEnv(Protocol):
    """An episode's environment that wraps the user's (rloo.envs.CheckedEnv): the user's class name,
    which an error names."""

    def env_name(self) -> str: ...


@runtime_checkable
class EpisodeRollout(Protocol):
    """A rollout of multi-turn episodes (rloo.rollout.multiturn.Trajectories): the policy's tokens
    among the environment's (N,T) bool, each episode's summed environment reward (N,), its stats."""

    policy_mask: Tensor | None
    env_rewards: Tensor | None
    env_stats: dict[str, float]


@runtime_checkable
class PreScoredRollout(Protocol):
    """A rollout the producer scored where it sampled (rloo.rollout.producer.ScoredRollout): (scores
    (N,), reference log-probs (N,T)), or None."""

    scored: tuple[Tensor, Tensor] | None
