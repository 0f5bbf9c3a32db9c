"""The evaluation section (`eval.*` of the RL and pipeline configs, and `rloo eval`'s own keys):
how policies are compared on held-out prompts, and how their responses are generated."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from rloo.config.base import MAX_SAMPLES, Strict
from rloo.config.generation import (
    MinNewTokens,
    RepetitionPenalty,
    Sampling,
    Stop,
    TopK,
    TopP,
    check_temperature,
    sampling_of,
)


class EvalSettings(Strict):
    """How policies are compared on held-out prompts."""

    num_prompts: int = Field(default=400, ge=1, description="Held-out prompts, each judged against its reference.")
    temperature: float = Field(
        default=1.0,
        ge=0,
        description="Sampling temperature of the evaluated policies (>= 0.01), or 0: greedy (argmax) decoding.",
    )
    top_p: TopP = 1.0
    top_k: TopK = 0
    min_new_tokens: MinNewTokens = 0
    stop: Stop = Field(default_factory=list)
    repetition_penalty: RepetitionPenalty = 1.0
    batch_size: int = Field(default=128, ge=1)
    judge: str | None = Field(
        default=None,
        description="Who judges responses against references: null (the task's gold judge; the reward "
        "model when a dataset replaces the task), 'gold', 'reward_model', module:function or "
        "path/to/file.py:function (batched: (prompts, completions) -> floats).",
    )
    checker: str | None = Field(
        default=None,
        description="A checker module:function or path/to/file.py:function, batched like a reward: 1 solved, 0 "
        "not, None unreadable. Evaluation adds pass@k (pass_samples samples per held-out prompt).",
    )
    pass_samples: int = Field(
        default=16,
        ge=8,
        le=MAX_SAMPLES,
        description="Tasks with a checker (arithmetic): samples per held-out problem for pass@k, k = 1, 2, 4, 8.",
    )

    @field_validator("temperature")
    @classmethod
    def _greedy_allowed(cls, v: float) -> float:
        return check_temperature(v, greedy=True)

    def sampling(self, max_new_tokens: int, max_prompt_tokens: int) -> Sampling:
        """How evaluation samples: these keys, with the run's length limits (an RL run's eval uses
        rl.max_new_tokens; `rloo eval` its own)."""
        return sampling_of(self, max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens)


def reward_fn_as_judge(data: Any) -> Any:
    """An RLConfig's raw settings with its eval's judge defaulted: on a dataset with no reward model
    and no eval.judge, the (first) Python reward judges the evaluation (a dataset has no gold judge,
    and there is nothing else to judge with). The one place of this default: the pipeline's RL and
    eval stages take it from the RLConfig."""
    if not isinstance(data, dict) or data.get("dataset") is None or data.get("reward_model") is not None:
        return data
    fns, ev = data.get("reward_fn"), data.get("eval") or {}
    judge = ev.judge if isinstance(ev, EvalSettings) else ev.get("judge") if isinstance(ev, dict) else ""
    if not fns or not isinstance(fns, (str, list)) or judge is not None:  # a bad value: validation says so
        return data
    first = fns if isinstance(fns, str) else fns[0]  # several are summed in training: the first judges
    ev = ev.model_copy(update={"judge": first}) if isinstance(ev, EvalSettings) else {**ev, "judge": first}
    return {**data, "eval": ev}
