"""The limits of multi-turn episodes (`env=...`, rloo.envs; docs/agents.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from rloo.config.base import Strict
from rloo.config.methods import capable, one_of, spec_of_variant, why_not_multi_turn

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
        default=10.0, gt=0, description="One environment reset or step longer than this stops the run (one line)."
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


def episode_default_methods(data):
    """`rloo compare`'s input with methods defaulting, for a study of episode tasks only, to the methods
    that train on episodes (MethodSpec.multi_turn) instead of every method."""
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if isinstance(tasks, list) and tasks and all(t in ENV_TASKS for t in tasks) and "methods" not in data:
        return data | {"methods": capable("multi_turn")}
    return data


def episode_study_refusal(tasks: Sequence[str], methods: Sequence[str], tuning_trials: int) -> str | None:
    """The one-line reason `rloo compare` refuses a study with episode tasks (ENV_TASKS), or None:
    text and episode tasks mixed (their reports read different metrics: win rate vs success rate),
    a method without `multi_turn` (each named with its reason), or tuning (it picks by win rate)."""
    episodic = [t for t in tasks if t in ENV_TASKS]
    if not episodic:
        return None
    if text := [t for t in tasks if t not in ENV_TASKS]:
        return (
            f"tasks: {', '.join(text)} (judged by win rate) and {', '.join(episodic)} (played as episodes, judged "
            "by success rate) cannot share one comparison; run them as two `rloo compare` studies"
        )
    refused = {m: why_not_multi_turn(spec_of_variant(m)) for m in methods if not spec_of_variant(m).multi_turn}
    if refused:
        reasons = "; ".join(f"{m}: {why}" for m, why in refused.items())
        return (
            f"methods {', '.join(refused)} do not train on episodes ({', '.join(episodic)}: played as episodes; "
            f"choose among {one_of(capable('multi_turn'))} and their variants): {reasons}"
        )
    if tuning_trials:
        return f"tuning.trials: tuning picks by win rate, which {', '.join(episodic)} (episodes) do not have; set 0"
    return None
