"""Built-in synthetic RLHF tasks: the paper's experiments at laptop scale, nothing downloaded.

- ``summarize`` (default): Reddit TL;DR stand-in, summarize a post by listing its key words.
- ``dialogue``: Anthropic HH stand-in, help with benign requests and refuse harmful ones.

Each task gives prompts with mixed-quality references (SFT data), a deterministic gold judge
(``gold_score``, the stand-in for the paper's GPT-4 judge), and a Bradley-Terry labeler built on
the gold judge (preference data for the reward model). Success for RL is a rising ``win_rate``
of policy responses against the references, judged by the gold judge.
"""

from __future__ import annotations

from rloo.tasks.base import (
    DEFAULT_LABEL_TEMPERATURE,
    SPLITS,
    Example,
    Task,
    task_stats,
    win_rate,
)
from rloo.tasks.dialogue import DialogueTask
from rloo.tasks.summarize import SummarizeTask

TASKS: tuple[str, ...] = ("summarize", "dialogue")


def get_task(name: str = "summarize") -> Task:
    """A fresh task by name (tasks are stateless, so instances are interchangeable)."""
    if name == "summarize":
        return SummarizeTask()
    if name == "dialogue":
        return DialogueTask()
    raise ValueError(f"unknown task {name!r}; available: {', '.join(TASKS)}")


__all__ = [
    "DEFAULT_LABEL_TEMPERATURE",
    "SPLITS",
    "TASKS",
    "DialogueTask",
    "Example",
    "SummarizeTask",
    "Task",
    "get_task",
    "task_stats",
    "win_rate",
]
