"""Judges for evaluation: who decides whether a response beats the reference.

A `Judge` has a `name` (shown in every evaluation table, JSON and log line, so a number is never
read as a gold-judge score when a reward model produced it) and scores (prompts, responses)
in batches; `judge(prompt, response) -> float` still works. Three kinds: the built-in task's
deterministic gold judge, a reward model, or a user's Python callable (`module:function` or
`path/to/file.py:function`) with the batched reward signature (prompts, completions) -> floats.

A reward-model judge scores a policy's sampled responses exactly as training scored them
(`score_rollout`: the sampled token ids when the reward model shares the policy's tokenizer),
not by re-tokenizing the decoded text, which differs (rloo.rollout strips the decoded text, and a
re-tokenization need not give the sampled ids back): the same samples would get other scores.
"""

from __future__ import annotations

from collections.abc import Callable

from rloo.errors import RlooError
from rloo.rewards.sources import FunctionReward, load_function


class Judge:
    """judge.score(rollout) -> one float per response; judge.score_texts(prompts, texts) for text
    (the references); judge(prompt, response) -> float. `kind`: gold (a built-in task's gold judge),
    reward_model or function; it names the judge's metric (rloo.eval.judge.score_key)."""

    def __init__(self, name: str, score_texts: Callable, score_rollout: Callable | None = None, kind: str = "function"):
        self.name, self._texts, self._rollout, self.kind = name, score_texts, score_rollout, kind

    def score_texts(self, prompts: list[str], responses: list[str]) -> list[float]:
        return [float(v) for v in self._texts(list(prompts), list(responses))]

    def score(self, roll) -> list[float]:
        if self._rollout is not None:
            return [float(v) for v in self._rollout(roll)]
        return self.score_texts(roll.prompts, roll.completions)

    def __call__(self, prompt: str, response: str) -> float:
        return self.score_texts([prompt], [response])[0]

    def __repr__(self) -> str:
        return f"Judge({self.name!r})"


def task_judge(task) -> Judge:
    return Judge(
        f"gold judge ({task.name})",
        lambda ps, cs: [task.gold_score(p, c) for p, c in zip(ps, cs, strict=False)],
        kind="gold",
    )


def scorer_judge(scorer, name: str) -> Judge:
    """A judge from a reward source: `scorer(rollout)` for samples, `scorer.score_texts` for text."""
    return Judge(name, scorer.score_texts, score_rollout=scorer if callable(scorer) else None, kind="reward_model")


def make_judge(
    spec: str | None, *, task=None, reward_scorer=None, use_task: bool = True, reward_name: str = "reward model"
) -> Judge | None:
    """`spec`: None (the task's gold judge when `use_task`, else the reward model when there is one),
    'gold', 'reward_model', or a callable's spec. Returns None when nothing can judge."""
    if spec is None:
        if use_task and task is not None:
            return task_judge(task)
        return scorer_judge(reward_scorer, reward_name) if reward_scorer is not None else None
    if spec == "gold":
        if task is None:
            raise RlooError("judge=gold needs a built-in task")
        return task_judge(task)
    if spec == "reward_model":
        if reward_scorer is None:
            raise RlooError("judge=reward_model needs a reward model (set reward_model=PATH)")
        return scorer_judge(reward_scorer, reward_name)
    fn = FunctionReward(load_function(spec), name=spec)
    return Judge(spec, fn.score_texts)
