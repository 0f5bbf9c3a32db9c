"""What a reward source is: the protocol every source implements, and what the steps and the loop
call (`rloo.algorithms.base.Models.scorer` is one)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class RewardSource(Protocol):
    """r(x, y) of eq. (1).

    `source(batch)`: a `rloo.rollout.Rollout` (its prompts, completions, token ids and masks, rows
    grouped by prompt) -> scores (N,) float tensor, NaN where it could not score (a reward
    function's None). `score_texts(prompts, completions)`: the same for text alone (judging, and
    sources summed by `WeightedReward`). `part_metrics()`: numbers the loop logs next to the step's
    metrics after each call (each part's mean for a combination; {} for one source).
    """

    def __call__(self, batch: Any, /) -> Tensor: ...

    def score_texts(self, prompts: list[str], completions: list[str]) -> Tensor: ...

    def part_metrics(self) -> dict[str, float]: ...


@runtime_checkable
class HoldsRewardModel(Protocol):
    """A source with a reward model among its parts (rloo.rewards.combine.WeightedReward), which a
    judge of "the reward model" scores with; None when it has none."""

    @property
    def reward_model(self) -> RewardSource | None: ...


def is_reward_source(obj: object) -> bool:
    """An object (not a class) with a reward source's three methods: used as it is."""
    return isinstance(obj, RewardSource) and not isinstance(obj, type)
