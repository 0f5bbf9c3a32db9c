"""The calculator task's environment (rloo.tasks.calculator): the `calc` tool and the arithmetic checker."""

from __future__ import annotations

from rloo.envs.tools import ToolEnv
from rloo.tasks.calculator import TOOL, calculator, check


class CalculatorEnv(ToolEnv):
    """rloo.tasks.calculator's episodes: the `calc` tool, and the arithmetic checker on the answer."""

    def __init__(self, tokenizer, timeout_s: float = 1.0, end_ids: frozenset[int] | None = None):
        super().__init__(tokenizer, {TOOL: calculator}, check, timeout_s, end_ids)
