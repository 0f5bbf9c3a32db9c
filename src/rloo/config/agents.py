"""The limits of multi-turn episodes (`env=...`, rloo.envs; docs/agents.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rloo.config.base import Strict

# `env=` names built into rloo (rloo.envs.calculator.BUILTIN_ENVS), and the built-in task each plays.
ENV_TASKS: dict[str, str] = {"calculator": "calculator", "guess": "guess"}

# `rloo pipeline task=calculator|guess` defaults, laid under the user's settings like arithmetic's
# (config/stages.py's TASK_PIPELINE_DEFAULTS holds them all).
ENV_PIPELINE_DEFAULTS: dict[str, dict] = {
    # multi-turn episodes with a calculator tool (rloo.tasks.calculator, docs/agents.md): a short SFT
    # teaches the format on the share of traces that use the tool; RLOO on whole episodes, beta = 0
    # (the checker is the reward, as for arithmetic); the evaluation plays episodes (rloo.eval.episodes)
    "calculator": {
        "max_response_tokens": 20,
        "sft": {"num_examples": 3000, "epochs": 6},
        "rl": {"k": 4, "batch_size": 16, "beta": 0.0, "lr": 3e-4, "steps": 60, "warmup_steps": 5, "eval_every": None},
        "eval": {"num_prompts": 100, "pass_samples": 8},
        "env_settings": {"max_turns": 3, "max_turn_tokens": 12, "max_total_tokens": 24},
    },
    # guess a number in 1..16 with higher/lower feedback (rloo.tasks.guess): SFT on a mediocre
    # player's games (feedback used half the time), RLOO on whole games; k = 8 x 80 steps: the best of
    # four settings tried on seed 0 (docs/results/agents-game/README.md); 8 turns of `guess <n>` and one
    # feedback word each
    "guess": {
        "max_response_tokens": 24,
        "sft": {"num_examples": 3000, "epochs": 6},
        "rl": {"k": 8, "batch_size": 16, "beta": 0.0, "lr": 3e-4, "steps": 80, "warmup_steps": 5, "eval_every": None},
        "eval": {"num_prompts": 100, "pass_samples": 8},
        "env_settings": {"max_turns": 8, "max_turn_tokens": 3, "max_total_tokens": 24},
    },
}


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
    chat_template: bool = Field(
        default=True,
        description="Play episodes in the policy tokenizer's chat template when it has one: the prompt as the "
        "first user message, each observation the next user (or tool) message (docs/agents.md).",
    )
    prefill_observations: bool = Field(
        default=True,
        description="Feed an observation into the KV cache in one forward pass (false: one token per decode "
        "step; the same episodes, docs/agents.md says when each is faster).",
    )
    observation_role: Literal["user", "tool"] = Field(
        default="user", description="The chat template's role of an environment's observation."
    )
