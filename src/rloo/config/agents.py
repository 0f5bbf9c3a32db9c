"""The limits of multi-turn episodes (`env=...`, rloo.envs; docs/agents.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from rloo.config.base import Strict
from rloo.config.generation import multi_turn_refusal
from rloo.config.methods import METHOD_SPECS, capable, one_of, spec_of_variant, why_not_multi_turn
from rloo.config.tasks import episode_tasks


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
    if isinstance(tasks, list) and tasks and all(t in episode_tasks() for t in tasks) and "methods" not in data:
        return data | {"methods": capable("multi_turn")}
    return data


def episode_study_refusal(tasks: Sequence[str], methods: Sequence[str], tuning_trials: int) -> str | None:
    """The one-line reason `rloo compare` refuses a study with episode tasks (TaskSpec.env), or None:
    text and episode tasks mixed (their reports read different metrics: win rate vs success rate),
    a method without `multi_turn` (each named with its reason), or tuning (it picks by win rate)."""
    episodic = [t for t in tasks if t in episode_tasks()]
    if not episodic:
        return None
    if text := [t for t in tasks if t not in episodic]:
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


def pipeline_env_refusal(rl, ev, reward_dataset) -> str | None:
    """The one-line reason `rloo pipeline env=...` refuses its sections, or None: the environment gives
    the reward (no rl.reward_fn, no reward.dataset), a method that trains on episodes, and no
    per-completion generation key in rl. or eval. (a turn ends at the environment's stop ids)."""
    if rl.reward_fn or reward_dataset is not None:
        return "env= gives the reward: leave rl.reward_fn and reward.dataset unset"
    if not (spec := METHOD_SPECS[rl.algorithm]).multi_turn:
        why = f": {why_not_multi_turn(spec)} (docs/agents.md)" if spec.value_model else ""
        return f"env= trains with rl.algorithm={one_of(capable('multi_turn'))} only, got {rl.algorithm}{why}"
    return multi_turn_refusal(rl, "rl.") or multi_turn_refusal(ev, "eval.")


def rl_env_refusal(rl) -> str | None:
    """The one-line reason `rloo train env=...` refuses its settings, or None: a method that trains
    on episodes, the environment as the only reward, on-policy."""
    if not (spec := METHOD_SPECS[rl.algorithm]).multi_turn:
        why = f": {why_not_multi_turn(spec)} (docs/agents.md)" if spec.value_model else ""
        methods = one_of(capable("multi_turn"))
        return f"env= trains with algorithm={methods} only (for now), got algorithm={rl.algorithm}{why}"
    if rl.reward_model is not None or rl.reward_fn:
        return "env= gives the reward: leave reward_model and reward_fn unset"
    if rl.off_policy_correction is not None:
        return "env= trains on-policy only: max_staleness > 0 and is_correction are for single-turn rloo"
    return None


def eval_env_refusal(ev) -> str | None:
    """The one-line reason `rloo eval env=...` refuses its keys, or None: the environment judges (no
    reward_model, no judge) and no per-completion generation key."""
    if ev.reward_model is not None or ev.judge is not None:
        return "env= gives the reward and judges the episodes: leave reward_model and judge unset"
    return multi_turn_refusal(ev)
