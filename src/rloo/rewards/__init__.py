"""Reward sources. Each is a callable Rollout -> scores (N,) float tensor."""

from rloo.rewards.sources import FunctionReward, RewardModelScorer, load_function

__all__ = ["FunctionReward", "RewardModelScorer", "load_function"]
