"""The limits of multi-turn episodes (`env=...`, rloo.envs; docs/agents.md)."""

from __future__ import annotations

from pydantic import Field

from rloo.config.base import Strict

# `env=` names built into rloo (rloo.envs.calculator.BUILTIN_ENVS), and the built-in task each plays.
ENV_TASKS: dict[str, str] = {"calculator": "calculator", "guess": "guess"}


class EnvSettings(Strict):
    """Limits of one episode. One that reaches a limit before the environment says done is truncated
    (`truncation_penalty`, when set, replaces its reward, as for a response without EOS)."""

    max_turns: int = Field(default=3, ge=1, description="Policy turns per episode at most.")
    max_turn_tokens: int = Field(default=16, ge=1, description="Tokens of one policy turn at most.")
    max_total_tokens: int = Field(
        default=32, ge=1, description="Tokens after the prompt at most: the policy's turns and the observations."
    )
    step_timeout_s: float = Field(
        default=10.0, gt=0, description="One environment step longer than this stops the run (one line)."
    )
    tool_timeout_s: float = Field(
        default=1.0, gt=0, description="Built-in tools: a call longer than this answers with an error record."
    )
