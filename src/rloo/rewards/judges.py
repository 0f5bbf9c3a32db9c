"""Judges for evaluation: who decides whether a response beats the reference.

A judge is `judge(prompt, response) -> float` (higher is better), what `evaluate_policy` calls.
Three kinds: the built-in task's deterministic gold judge, a reward model, or a user's Python
callable `module:function` with the batched reward signature (prompts, completions) -> floats.
"""

from __future__ import annotations

from collections.abc import Callable

from rloo.errors import RlooError
from rloo.rewards.sources import FunctionReward, load_function

Judge = Callable[[str, str], float]


def batched_judge(scorer) -> Judge:
    """A per-pair judge from anything with `score_texts(prompts, completions) -> (N,)`."""
    return lambda prompt, response: float(scorer.score_texts([prompt], [response])[0])


def make_judge(spec: str | None, *, task=None, reward_scorer=None, use_task: bool = True) -> Judge | None:
    """`spec`: None (the task's gold judge when `use_task`, else the reward model when there is one),
    'gold', 'reward_model', or 'module:function'. Returns None when nothing can judge."""
    if spec is None:
        if use_task and task is not None:
            return task.gold_score
        return batched_judge(reward_scorer) if reward_scorer is not None else None
    if spec == "gold":
        if task is None:
            raise RlooError("judge=gold needs a built-in task")
        return task.gold_score
    if spec == "reward_model":
        if reward_scorer is None:
            raise RlooError("judge=reward_model needs a reward model (set reward_model=PATH)")
        return batched_judge(reward_scorer)
    return batched_judge(FunctionReward(load_function(spec), name=spec))
