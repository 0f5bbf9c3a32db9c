"""Reward sources. Each is a `RewardSource` (rewards/base.py): Rollout -> scores (N,) float tensor,
text -> scores, and the metrics it logs."""

from rloo.rewards.base import RewardSource, is_reward_source
from rloo.rewards.combine import WeightedReward, build_reward
from rloo.rewards.sources import FunctionReward, RewardModelScorer, load_function

__all__ = [
    "FunctionReward",
    "RewardModelScorer",
    "RewardSource",
    "WeightedReward",
    "build_reward",
    "is_reward_source",
    "load_function",
]
