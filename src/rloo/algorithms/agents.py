"""Multi-turn episodes as an RLOO step's samples: the environment layer (rloo.envs) meets the
multi-turn sampler (rloo.rollout.multiturn) here.

A step on `prompts` plays k episodes of each (one fresh environment each); the episode's reward is
the sum of its environment's step rewards (`episode_reward`, the scorer of such a run), and the
update counts the policy's tokens only (rloo.rollout.multiturn.policy_tokens). The methods whose
MethodSpec sets multi_turn train on episodes (docs/agents.md says which and why).
"""

from __future__ import annotations

import torch

from rloo.config import RLConfig
from rloo.envs import EnvSpec, make_env
from rloo.errors import EnvError
from rloo.rollout.capabilities import EpisodeRollout
from rloo.rollout.captured import captured_refusal, fall_back
from rloo.rollout.multiturn import Limits, Trajectories, episodes
from rloo.runtime.distributed import unwrap


class EpisodeReward:
    """The scorer of a multi-turn run (a rloo.rewards.base.RewardSource): each episode's summed
    environment reward (N,)."""

    def __call__(self, roll) -> torch.Tensor:
        rewards = roll.env_rewards if isinstance(roll, EpisodeRollout) else None
        if rewards is None:
            raise EnvError("episode_reward scores multi-turn episodes only; this rollout has no environment rewards")
        return rewards

    def score_texts(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        raise EnvError("an environment's reward comes from its episodes, not from texts alone")

    def part_metrics(self) -> dict[str, float]:
        return {}


episode_reward = EpisodeReward()


def limits(spec: EnvSpec) -> Limits:
    return Limits(spec.max_turns, spec.max_turn_tokens, spec.max_total_tokens, spec.step_timeout_s)


def sample_episodes(models, prompts: list[str], cfg: RLConfig, gen: torch.Generator, rows=None) -> Trajectories:
    """Step 1 of RLOO on an environment: k episodes per prompt, batched (rloo.rollout.multiturn.episodes)."""
    spec: EnvSpec = models.env
    if rows is not None and tuple(rows) != (0, len(prompts) * cfg.k):  # a share of a torchrun batch
        raise EnvError("multi-turn environments run in one process for now (not under torchrun)")
    policy = unwrap(models.policy)
    if captured_refusal(cfg.captured_decode, policy, next(policy.parameters()).device, None, None) is None:
        fall_back(cfg.captured_decode, "multi-turn episodes: each turn's rows, cache and length change between turns")
    vocab = policy.get_input_embeddings().weight.shape[0]
    envs = [make_env(spec.factory, vocab) for _ in range(len(prompts) * cfg.k)]
    return episodes(
        policy,
        models.tokenizer,
        envs,
        prompts,
        cfg.k,
        limits(spec),
        cfg.sampling,
        generator=gen,
        chat=spec.chat,
        prefill_observations=spec.prefill_observations,
    )
