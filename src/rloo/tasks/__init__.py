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

from rloo.config.tasks import DEFAULT_TASK, TASK_SPECS, TaskSpec, check_task, task_names
from rloo.runtime.inputs.user_code import load_callable
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


def get_task(name: str = DEFAULT_TASK) -> Task:
    """A fresh task by name, built from its class in the task table (rloo.config.TASK_SPECS; tasks are
    stateless, so instances are interchangeable)."""
    spec = TASK_SPECS[check_task(name)]
    cls = load_callable(spec.task, f"task {name}'s class") if isinstance(spec.task, str) else spec.task
    return cls()


def _spec(task: Task | None) -> TaskSpec | None:
    return None if task is None else TASK_SPECS.get(task.name)


def has_checker(task) -> bool:
    """Whether a task's gold judge is a checker (1 solved, 0 not: pass@k eval; TaskSpec.judge)."""
    spec = _spec(task)
    return spec is not None and spec.judge == "checker"


def plays_episodes(task) -> bool:
    """Whether a task is played as multi-turn episodes with its environment (TaskSpec.env): the
    environment gives the reward (no reward model), and the task is judged by its success rate over
    episodes (rloo.eval.episodes), not by a win rate of single completions."""
    spec = _spec(task)
    return spec is not None and spec.env is not None


def tasks() -> tuple[str, ...]:
    """The tasks' names in table order (a task added by add_task included)."""
    return task_names()


__all__ = [
    "ArithmeticTask",
    "CalculatorTask",
    "DEFAULT_LABEL_TEMPERATURE",
    "SPLITS",
    "DialogueTask",
    "GuessTask",
    "Example",
    "SummarizeTask",
    "Task",
    "get_task",
    "has_checker",
    "plays_episodes",
    "task_stats",
    "tasks",
    "win_rate",
]
