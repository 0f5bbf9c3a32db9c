"""Several reward sources summed with weights, and the builder that turns a config into one
reward source (`reward_model`, `reward_fn` (one or several), or both)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rloo.errors import RlooError
from rloo.rewards.base import RewardSource, is_reward_source
from rloo.rewards.sources import FunctionReward, RewardModelScorer, load_function
from rloo.runtime.inputs.user_code import callable_name


class WeightedReward:
    """r(x, y) = sum_j w_j r_j(x, y) over named sources, each a RewardSource (rewards/base.py).

    The parts are kept (`last_parts`) so the loop can log each source's mean next to the total.
    """

    def __init__(self, sources: dict[str, RewardSource], weights: dict[str, float] | None = None):
        if not sources:
            raise RlooError("no reward source: set reward_model=PATH or reward_fn=module:function")
        weights = weights or {}
        unknown = set(weights) - set(sources)
        if unknown:
            raise RlooError(
                f"reward_weights names {', '.join(sorted(unknown))}, which is not a reward source "
                f"(sources: {', '.join(sources)})"
            )
        self.sources, self.weights = sources, {n: float(weights.get(n, 1.0)) for n in sources}
        self.last_parts: dict[str, float] = {}

    def __call__(self, batch) -> Tensor:
        total = None
        for name, src in self.sources.items():
            s = src(batch).float().cpu()
            self.last_parts[name] = s.nanmean().item()  # unscored (None -> NaN) samples left out
            total = self.weights[name] * s if total is None else total + self.weights[name] * s
        return total

    def part_metrics(self) -> dict[str, float]:
        """Each source's mean score of the last batch (`reward/part/<name>`), when there are several,
        and the sources' own metrics."""
        out = {f"reward/part/{n}": v for n, v in self.last_parts.items()} if len(self.sources) > 1 else {}
        for src in self.sources.values():
            out |= src.part_metrics()
        return out

    def score_texts(self, prompts: list[str], completions: list[str]) -> Tensor:
        parts = [
            self.weights[n] * src.score_texts(prompts, completions).float().cpu() for n, src in self.sources.items()
        ]
        return torch.stack(parts).sum(0)

    @property
    def reward_model(self):
        """The reward-model scorer among the sources, if any (for judging with the reward model)."""
        return self.sources.get("reward_model")


def _source(fn) -> RewardSource:
    """A RewardSource as it is; a function (prompts, completions) -> floats, checked (FunctionReward)."""
    return fn if is_reward_source(fn) else FunctionReward(fn)


def build_reward(cfg, policy_tokenizer, reward_fn: Callable | None = None, load_rm=None) -> WeightedReward:
    """The reward source a config asks for. A `reward_fn` callable given to the API takes the place
    of cfg.reward_fn; a reward model and function(s) together are summed with cfg.reward_weights."""
    sources: dict[str, RewardSource] = {}
    if cfg.reward_model is not None:
        rm, rm_tok = load_rm(cfg.reward_model)
        sources["reward_model"] = RewardModelScorer(
            rm,
            rm_tok,
            policy_tokenizer=policy_tokenizer,
            max_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
            share_prompt=cfg.share_prompt,
        )
    if reward_fn is not None:
        sources[callable_name(reward_fn, "reward_fn")] = _source(reward_fn)
    else:
        specs = [cfg.reward_fn] if isinstance(cfg.reward_fn, str) else list(cfg.reward_fn or [])
        for spec in specs:
            sources[spec] = _source(load_function(spec))
    return WeightedReward(sources, cfg.reward_weights)
