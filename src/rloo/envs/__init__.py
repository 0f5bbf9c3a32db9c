"""Multi-turn environments: the episode protocol, tools, the built-in ones (each a task's, named in
the task table) and loading a user's environment class (factory.py).

An environment is a reward source that also answers with observations (docs/agents.md). It sits
beside `rewards/`; the multi-turn sampler (rloo.rollout.multiturn) drives it and the algorithms
layer connects the two.
"""

from rloo.envs.base import (
    CheckedEnv,
    EnvError,
    EnvFactory,
    Environment,
    EnvSpec,
    Step,
    checked_reset,
    checked_step,
    make_env,
    stop_ids,
    turn_text,
)
from rloo.envs.factory import env_factory
from rloo.envs.tools import ToolEnv, call_tool, parse_call

__all__ = [
    "CheckedEnv",
    "EnvError",
    "EnvFactory",
    "EnvSpec",
    "Environment",
    "Step",
    "ToolEnv",
    "call_tool",
    "checked_reset",
    "checked_step",
    "env_factory",
    "make_env",
    "parse_call",
    "stop_ids",
    "turn_text",
]
