"""Built-in synthetic RLHF tasks: the paper's experiments at laptop scale, nothing downloaded.

- ``summarize`` (default): Reddit TL;DR stand-in, summarize a post by listing its key words.
- ``dialogue``: Anthropic HH stand-in, help with benign requests and refuse harmful ones.
- ``arithmetic``: small integer problems scored by a checker (RL with verifiable rewards): no
  reward model, the checker is the reward and the gold judge; success is a rising pass@k.

Each task gives prompts with mixed-quality references (SFT data), a deterministic gold judge
(``gold_score``, the stand-in for the paper's GPT-4 judge), and a Bradley-Terry labeler built on
the gold judge (preference data for the reward model). Success for RL is a rising ``win_rate``
of policy responses against the references, judged by the gold judge.
"""

from __future__ import annotations

from rloo.tasks.arithmetic import ArithmeticTask
from rloo.tasks.base import (
    DEFAULT_LABEL_TEMPERATURE,
    SPLITS,
    Example,
    Task,
    task_stats,
    win_rate,
)
from rloo.tasks.calculator import CalculatorTask
from rloo.tasks.dialogue import DialogueTask
from rloo.tasks.guess import GuessTask
from rloo.tasks.summarize import SummarizeTask

TASKS: tuple[str, ...] = ("summarize", "dialogue", "arithmetic", "calculator", "guess")


def get_task(name: str = "summarize") -> Task:
    """A fresh task by name (tasks are stateless, so instances are interchangeable)."""
    if name == "summarize":
        return SummarizeTask()
    if name == "dialogue":
        return DialogueTask()
    if name == "arithmetic":
        return ArithmeticTask()
    if name == "calculator":
        return CalculatorTask()
    if name == "guess":
        return GuessTask()
    raise ValueError(f"unknown task {name!r}; available: {', '.join(TASKS)}")


def has_checker(task) -> bool:
    """Whether a task is scored by a checker (reward = checker, no reward model, pass@k eval)."""
    return bool(getattr(task, "has_checker", False))


def plays_episodes(task) -> bool:
    """Whether a task is played as multi-turn episodes with its environment (calculator, guess): the
    environment gives the reward (no reward model), and the task is judged by its success rate over
    episodes (rloo.eval.episodes), not by a win rate of single completions."""
    return bool(getattr(task, "has_env", False))


__all__ = [
    "ArithmeticTask",
    "DEFAULT_LABEL_TEMPERATURE",
    "SPLITS",
    "TASKS",
    "DialogueTask",
    "GuessTask",
    "Example",
    "SummarizeTask",
    "Task",
    "get_task",
    "has_checker",
    "plays_episodes",
    "task_stats",
    "win_rate",
]
