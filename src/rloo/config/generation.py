"""The generation settings of training rollouts (`rl.*`) and evaluation (`eval.*`), typed once:
temperature (0, greedy, for evaluation only), top_k, top_p, min_new_tokens, stop strings and the
repetition penalty (rloo.rollout.decoding applies them; docs/configs.md, "Sampling settings and the
log-probs", states which make the sample off-policy)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from rloo.config.base import MIN_TEMPERATURE

# A penalty divides (or multiplies) a seen token's logit: beyond 100 it only says "never repeat",
# which 100 already does; HF and vLLM take any value > 0.
MAX_REPETITION_PENALTY = 100.0
# More stop strings than this are checked on every row at every step: a list, not a setting.
MAX_STOP_STRINGS = 64

TopK = Annotated[
    int,
    Field(
        ge=0,
        description="Sample among the top_k most likely tokens only (Hugging Face's top_k; ties at the "
        "boundary stay); 0: all. Shapes the sample away from pi (docs/configs.md).",
    ),
]
TopP = Annotated[float, Field(gt=0, le=1, description="Nucleus sampling mass; 1: all. Shapes the sample away from pi.")]
MinNewTokens = Annotated[
    int,
    Field(
        ge=0,
        description="EOS is forbidden and stop strings are not checked before this many new tokens "
        "(Hugging Face's min_new_tokens, vLLM's min_tokens); 0: off. Shapes the sample away from pi.",
    ),
]
Stop = Annotated[
    list[Annotated[str, Field(min_length=1)]],
    BeforeValidator(lambda v: [v] if isinstance(v, str) else v),  # stop='###': one stop string
    Field(
        max_length=MAX_STOP_STRINGS,
        description="Stop strings: a completion ends at the token whose decoded text completes one (that "
        "token and the stop string stay in the completion; later positions are padding, masked). "
        "Checked on the decoded text, never re-tokenized. One string or a list; [] (default): none.",
    ),
]
RepetitionPenalty = Annotated[
    float,
    Field(
        gt=0,
        le=MAX_REPETITION_PENALTY,
        description="Hugging Face's repetition_penalty (CTRL): the logit of a token already in the prompt or "
        "the completion is divided by it (multiplied if negative); 1: off. Shapes the sample away from pi.",
    ),
]


def check_temperature(value: float, greedy: bool) -> float:
    """A temperature >= MIN_TEMPERATURE, or 0 (greedy decoding) where `greedy` allows it (evaluation);
    training refuses 0 in one line: its k samples per prompt would be identical."""
    if value == 0 and not greedy:
        raise PydanticCustomError(
            "greedy_training",
            "temperature=0 (greedy) is for evaluation only (eval.temperature=0): training's k samples per "
            "prompt would be identical, so every leave-one-out advantage is 0",
        )
    if value != 0 and value < MIN_TEMPERATURE:
        hint = ", or 0 for greedy decoding" if greedy else ""
        raise PydanticCustomError(
            "greater_than_equal", "Input should be greater than or equal to {ge}" + hint, {"ge": MIN_TEMPERATURE}
        )
    return value


def check_min_new_tokens(min_new_tokens: int, max_new_tokens: int, prefix: str = "") -> None:
    """Refuse a minimum above the limit (every completion would be cut at max_new_tokens)."""
    if min_new_tokens > max_new_tokens:
        raise ValueError(
            f"{prefix}min_new_tokens={min_new_tokens} exceeds max_new_tokens={max_new_tokens}: "
            f"every completion would be cut at max_new_tokens"
        )


# The settings that end or shape a single completion; a multi-turn episode's turns end at the
# environment's stop ids instead (rloo.rollout.multiturn), so env= refuses them.
PER_COMPLETION = (("min_new_tokens", 0), ("stop", []), ("repetition_penalty", 1.0))


def multi_turn_refusal(settings, prefix: str = "") -> str | None:
    """The one-line reason an env= run refuses `settings`' generation keys, or None."""
    values = settings.model_dump(include={name for name, _ in PER_COMPLETION})  # a stage config (pydantic)
    for name, off in PER_COMPLETION:
        if values[name] != off:
            return (
                f"env= (multi-turn) samples its turns with temperature, top_k and top_p only; "
                f"unset {prefix}{name} (a turn ends at the environment's stop ids)"
            )
    return None


def truncating(s) -> bool:
    """Whether top_k or top_p truncates the distribution drawn from. `s`: a Sampling, or a config
    section holding the generation keys (an RL section validating itself, before its Sampling exists)."""
    return s.top_p < 1 or s.top_k > 0


def check_rl_generation(cfg) -> None:
    """An RL config's generation keys against the rest: env= refuses the per-completion ones (its
    own and its evaluation's); the periodic evals' min_new_tokens fits rl.max_new_tokens."""
    if cfg.env is not None and (why := multi_turn_refusal(cfg) or multi_turn_refusal(cfg.eval, "eval.")):
        raise ValueError(why)
    check_min_new_tokens(cfg.eval.min_new_tokens, cfg.max_new_tokens, "eval.")


@dataclass(frozen=True)
class Sampling:
    """What a rollout is asked to do, in one object: every sampler (rloo's own, its captured decode
    step, vLLM, the multi-turn sampler, the producer) and every evaluation reads its settings from
    here, built once from a config (`RLSettings.sampling`, `EvalSettings.sampling`). The same
    checks as the config's fields, so a Sampling made by hand (tests, the API) is valid too.

    max_new_tokens: T, the completion limit; max_prompt_tokens: longer prompts keep their last
    tokens; temperature 0: greedy (evaluation only; the config refuses it in training); top_p,
    top_k, min_new_tokens, repetition_penalty, stop: rloo.rollout.decoding; truncated_logprobs:
    rl.logprobs_under resolved (the stored log-probs are the truncated distribution's);
    share_prompt: each prompt prefilled once per group of k."""

    max_new_tokens: int
    max_prompt_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    truncated_logprobs: bool = False
    share_prompt: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))  # a list from a config or a caller
        bad = [
            name
            for name, ok in (
                ("max_new_tokens >= 1", self.max_new_tokens >= 1),
                ("max_prompt_tokens >= 1", self.max_prompt_tokens >= 1),
                ("temperature 0 or >= MIN_TEMPERATURE", self.temperature == 0 or self.temperature >= MIN_TEMPERATURE),
                ("0 < top_p <= 1", 0 < self.top_p <= 1),
                ("top_k >= 0", self.top_k >= 0),
                ("0 < repetition_penalty <= 100", 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY),
                ("stop strings non-empty", all(self.stop)),
            )
            if not ok
        ]
        if bad:
            raise ValueError(f"Sampling: needs {', '.join(bad)}: {self}")
        check_min_new_tokens(self.min_new_tokens, self.max_new_tokens)

    @property
    def truncates(self) -> bool:
        """Whether top_k or top_p truncates the distribution drawn from (rloo.core.truncation's K(s))."""
        return truncating(self)

    @property
    def shaped(self) -> bool:
        """Whether anything but the temperature shapes the distribution drawn from."""
        return self.truncates or self.min_new_tokens > 0 or self.repetition_penalty != 1

    def hf_draw(self) -> dict[str, float | int]:
        """The draw's settings under Hugging Face's generate names (TRL's trainer configs take the
        same): temperature, top_p, top_k."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    def replace(self, **changes) -> Sampling:
        """A copy with `changes` (validated again)."""
        return dataclasses.replace(self, **changes)


def sampling_of(section, *, max_new_tokens: int, max_prompt_tokens: int, **rest) -> Sampling:
    """The Sampling of a config section holding the generation keys (an RL or eval section); `rest`:
    share_prompt and truncated_logprobs, which only training sets."""
    keys = {"temperature", "top_p", "top_k", "min_new_tokens", "repetition_penalty", "stop"}
    return Sampling(max_new_tokens, max_prompt_tokens, **section.model_dump(include=keys), **rest)


def rl_sampling(cfg) -> Sampling:
    """An RL config's Sampling: its generation keys, lengths, share_prompt and resolved logprobs_under."""
    lengths = dict(max_new_tokens=cfg.max_new_tokens, max_prompt_tokens=cfg.max_prompt_tokens)
    return sampling_of(cfg, **lengths, share_prompt=cfg.share_prompt, truncated_logprobs=cfg.truncated_logprobs)


def rl_eval_sampling(cfg) -> Sampling:
    """How an RL config's periodic and final evaluations sample: eval.*, with rl.max_new_tokens."""
    return cfg.eval.sampling(cfg.max_new_tokens, cfg.max_prompt_tokens)
