"""Reward sources. Each is a callable Rollout -> scores (N,) float tensor."""

from rloo.rewards.combine import WeightedReward, build_reward
from rloo.rewards.sources import FunctionReward, RewardModelScorer, load_function

__all__ = ["FunctionReward", "RewardModelScorer", "WeightedReward", "build_reward", "load_function"]
