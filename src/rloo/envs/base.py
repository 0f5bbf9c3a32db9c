"""The episode protocol: what a multi-turn environment is, and the checks on what it returns.

An episode starts from a task prompt. `reset(prompt)` returns the token ids the policy's first turn
continues (the environment tokenizes its own text, once). Each turn the policy generates until it
stops (EOS, one of the environment's `stop_ids`, or the per-turn token limit), and
`step(turn_ids)` receives exactly the ids the policy sampled in that turn and answers with a `Step`:
observation token ids appended to the context (never a re-encoding of the policy's tokens), an
optional reward and `done`. The trajectory's reward is the sum of the rewards of its steps (0 if
none gave one).

User environments are plain classes with these two methods; `checked_reset` / `checked_step` turn a
misbehaving one (raises, wrong types, ids outside the vocabulary) into one `EnvError` line.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rloo.data.chat_turns import ChatFrame
from rloo.data.columns import keywords_for, row_columns
from rloo.errors import EnvError, StopNow
from rloo.runtime.inputs.user_code import callable_name


@dataclass
class Step:
    """An environment's answer to one policy turn."""

    observation: list[int]  # token ids appended after the policy's turn (may be empty)
    reward: float | None = None  # added to the trajectory's reward; None: nothing this step
    done: bool = False  # the episode ends after the policy's turn (the observation is then dropped)


class Environment(Protocol):
    """One episode's environment. `stop_ids`: token ids that end a policy turn besides EOS (a
    tool call's closing token), included in the turn."""

    stop_ids: Sequence[int]

    def reset(self, prompt: str) -> list[int]: ...

    def step(self, turn: list[int]) -> Step: ...


EnvFactory = Callable[[], Environment]  # a fresh environment per episode


@dataclass
class EnvSpec:
    """How episodes run: a factory of fresh environments and the limits of one episode.

    max_turns: policy turns at most; max_turn_tokens: tokens of one policy turn at most;
    max_total_tokens: trajectory tokens after the prompt (the policy's and the observations')
    at most. An episode that reaches a limit before `done` is truncated (rloo's
    `truncation_penalty`, when set, replaces its reward, as for a response without EOS).
    step_timeout_s: one `reset` or `step` call longer than this stops the run with an EnvError.
    chat: the policy tokenizer's chat template around the turns (rloo.data.chat_turns), or None."""

    factory: EnvFactory
    max_turns: int = 4
    max_turn_tokens: int = 16
    max_total_tokens: int = 48
    step_timeout_s: float = 10.0
    chat: ChatFrame | None = None
    prefill_observations: bool = True  # an observation in one forward pass (rloo.rollout.multiturn)

    @property
    def prompt_frame(self) -> int:
        """Tokens of an episode's first context besides its prompt's (the chat template's frame)."""
        return self.chat.around_prompt if self.chat is not None else 0


def turn_text(tokenizer, turn: list[int], end_ids: frozenset[int] | set[int]) -> str:
    """A policy turn's text, for an environment to parse: its ids decoded with their special tokens
    (a `<pad>` inside a turn stays in the text, so such a turn is malformed, not silently cleaned),
    less one final token of `end_ids` (EOS, the chat template's end-of-turn: rloo.data.chat_turns.end_ids),
    which closes the turn and is not its content."""
    body = turn[:-1] if turn and turn[-1] in end_ids else turn
    return tokenizer.decode(body, skip_special_tokens=False)


def _name(env) -> str:
    return type(env).__name__


def _user_call(env, what: str, fn, *args, **kwargs):
    """Call a user environment's method; any failure becomes one EnvError line."""
    try:
        return fn(*args, **kwargs)
    except (StopNow, EnvError):
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - any failure of user code
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise EnvError(f"environment {_name(env)}.{what} raised {type(e).__name__}: {first}") from e


def token_ids(value, env, what: str, vocab_size: int) -> list[int]:
    """`value` as a list of ints in [0, vocab_size), else an EnvError naming the environment."""
    if isinstance(value, (str, bytes)) or not (isinstance(value, Sequence) or hasattr(value, "tolist")):
        raise EnvError(f"environment {_name(env)}.{what} returned {type(value).__name__}, expected a list of token ids")
    ids = value.tolist() if hasattr(value, "tolist") else list(value)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= int(t) < vocab_size:
            raise EnvError(
                f"environment {_name(env)}.{what} returned {t!r} among its token ids, "
                f"expected ints in [0, {vocab_size})"
            )
    return [int(t) for t in ids]


def checked_reset(env, prompt: str, vocab_size: int) -> list[int]:
    """env.reset(prompt, **columns), checked: a non-empty list of token ids. `columns`: the task row's
    other columns (a dataset prompt's, rloo.data.columns), those that reset's signature names (all
    with **kwargs), one value each; a `reset(prompt)` is called with the prompt alone."""
    columns = keywords_for(env.reset, row_columns(prompt), skip=1)
    ids = token_ids(_user_call(env, "reset", env.reset, prompt, **columns), env, "reset", vocab_size)
    if not ids:
        raise EnvError(f"environment {_name(env)}.reset returned no tokens for prompt {prompt!r}")
    return ids


def checked_step(env, turn: list[int], vocab_size: int) -> Step:
    """env.step(turn), checked: a Step with token ids, a finite reward or None, and a bool done."""
    out = _user_call(env, "step", env.step, list(turn))
    if not isinstance(out, Step):
        raise EnvError(f"environment {_name(env)}.step returned {type(out).__name__}, expected rloo.envs.Step")
    obs = token_ids(out.observation, env, "step", vocab_size)
    r = out.reward
    if r is not None and (isinstance(r, bool) or not isinstance(r, numbers.Real) or not _fits(r)):
        shown = f"an integer of {r.bit_length()} bits" if isinstance(r, int) and r.bit_length() > 128 else repr(r)[:80]
        raise EnvError(
            f"environment {_name(env)}.step returned reward {shown}, expected a finite number (within float32's "
            "range) or None"
        )
    if not isinstance(out.done, bool):
        raise EnvError(f"environment {_name(env)}.step returned done={out.done!r}, expected True or False")
    return Step(obs, None if r is None else float(r), out.done)


_F32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: the episode rewards' dtype


def _fits(r: numbers.Real) -> bool:
    """Whether reward r is finite as a float32 (an int like 10**400 fits no float; 1e39 is inf in float32)."""
    try:
        return math.isfinite(float(r)) and abs(float(r)) <= _F32_MAX
    except OverflowError:
        return False


def stop_ids(env, vocab_size: int) -> frozenset[int]:
    """The environment's turn-ending token ids (none when it has no `stop_ids`), checked."""
    # getattr: a user's environment: stop_ids is optional
    return frozenset(token_ids(getattr(env, "stop_ids", ()), env, "stop_ids", vocab_size))


class CheckedEnv:
    """A user environment whose every answer is checked (`checked_reset`, `checked_step`): what the
    multi-turn sampler drives. `stats()`: the episode's tool counters, when the environment keeps them."""

    def __init__(self, env, vocab_size: int):
        self.env, self.vocab_size = env, vocab_size
        self.stop_ids = stop_ids(env, vocab_size)

    def reset(self, prompt: str) -> list[int]:
        return checked_reset(self.env, prompt, self.vocab_size)

    def step(self, turn: list[int]) -> Step:
        return checked_step(self.env, turn, self.vocab_size)

    def env_name(self) -> str:
        return _name(self.env)

    def stats(self) -> dict[str, float]:
        # getattr: a user's environment: its tool counters are optional
        return {k: float(getattr(self.env, k)) for k in ("tool_calls", "tool_errors") if hasattr(self.env, k)}


def make_env(factory: EnvFactory, vocab_size: int) -> CheckedEnv:
    """A fresh checked environment from the user's factory (a class or function of no arguments)."""
    try:
        env = factory()
    except (StopNow, EnvError):
        raise
    except Exception as e:  # noqa: BLE001 - any failure of user code
        name = callable_name(factory, repr(factory))
        raise EnvError(f"environment {name}() raised {type(e).__name__}: {e}") from e
    for method in ("reset", "step"):
        # getattr: a user's environment, checked for the two methods it must have
        if not callable(getattr(env, method, None)):
            raise EnvError(f"environment {type(env).__name__} has no {method}() method (see docs/agents.md)")
    return CheckedEnv(env, vocab_size)
