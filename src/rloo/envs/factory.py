"""A factory of fresh environments from `env=`: a built-in one (the environment of a task of the task
table, rloo.config.TASK_SPECS, named by the task) or a user's class (`env=myenv.py:MyEnv`)."""

from __future__ import annotations

from functools import partial

from rloo.config.tasks import TASK_SPECS, episode_tasks
from rloo.envs.base import EnvFactory
from rloo.errors import EnvError
from rloo.runtime.inputs.user_code import callable_name, load_callable


def builtin_env(name: str) -> type:
    """The environment class of task `name` (TaskSpec.env), loaded when named as `module:Class`."""
    env = TASK_SPECS[name].env
    assert env is not None, f"task {name} is not played as episodes"
    return load_callable(env, f"task {name}'s environment") if isinstance(env, str) else env  # type: ignore[return-value]


def env_factory(spec: str, tokenizer, tool_timeout_s: float = 1.0, end_ids: frozenset[int] | None = None) -> EnvFactory:
    """A factory of fresh environments: a built-in name (a task with an environment) or a user class
    `module:Class` / `path/to/file.py:Class`, called with the policy's tokenizer (it tokenizes its
    own observations, once). `end_ids`: the tokens that close a turn, for the built-in ones, which
    take (tokenizer, tool_timeout_s, end_ids)."""
    if spec in episode_tasks():
        return partial(builtin_env(spec), tokenizer, tool_timeout_s, end_ids)
    if ":" not in spec:
        raise EnvError(f"env={spec!r}: not a built-in environment ({', '.join(episode_tasks())}) nor file.py:Class")
    cls = load_callable(spec, "environment")
    factory = partial(cls, tokenizer)
    factory.__name__ = callable_name(cls, spec)  # type: ignore[attr-defined] - for error messages
    return factory
