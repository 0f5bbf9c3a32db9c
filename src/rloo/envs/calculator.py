"""The built-in environments, and loading a user's environment class (`env=myenv.py:MyEnv`)."""

from __future__ import annotations

from functools import partial

from rloo.envs.base import EnvFactory
from rloo.envs.guess import GuessEnv
from rloo.envs.tools import ToolEnv
from rloo.errors import EnvError
from rloo.runtime.user_code import load_callable
from rloo.tasks.calculator import TOOL, calculator, check


class CalculatorEnv(ToolEnv):
    """rloo.tasks.calculator's episodes: the `calc` tool, and the arithmetic checker on the answer."""

    def __init__(self, tokenizer, timeout_s: float = 1.0, end_ids: frozenset[int] | None = None):
        super().__init__(tokenizer, {TOOL: calculator}, check, timeout_s, end_ids)


BUILTIN_ENVS: dict[str, type] = {"calculator": CalculatorEnv, "guess": GuessEnv}


def env_factory(spec: str, tokenizer, tool_timeout_s: float = 1.0, end_ids: frozenset[int] | None = None) -> EnvFactory:
    """A factory of fresh environments: a built-in name (`calculator`, `guess`) or a user class
    `module:Class` / `path/to/file.py:Class`, called with the policy's tokenizer (it tokenizes its
    own observations, once). `end_ids`: the tokens that close a turn, for the built-in ones."""
    if spec in BUILTIN_ENVS:
        return partial(BUILTIN_ENVS[spec], tokenizer, tool_timeout_s, end_ids)
    if ":" not in spec:
        raise EnvError(f"env={spec!r}: not a built-in environment ({', '.join(BUILTIN_ENVS)}) nor file.py:Class")
    cls = load_callable(spec, "environment")
    factory = partial(cls, tokenizer)
    factory.__name__ = getattr(cls, "__name__", spec)  # type: ignore[attr-defined] - for error messages
    return factory
