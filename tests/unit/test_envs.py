"""The environment layer's contracts: the tool-call format, tool failures as one-line observations,
a misbehaving environment as one EnvError line, and the episode limits."""

from __future__ import annotations

import time

import pytest
import torch

from helpers.tiny_archs import V, tiny_lm
from rloo.config import Sampling
from rloo.envs import EnvError, EnvSpec, Step, call_tool, make_env, parse_call
from rloo.envs.calculator import CalculatorEnv
from rloo.rollout.multiturn import Limits, episodes
from rloo.tasks import get_task
from rloo.tasks.calculator import calculator
from rloo.tasks.tokenizer import build_tokenizer


def test_parse_call():
    assert parse_call("call calc 4 7 * 8 end".split()) == ("calc", "4 7 * 8")
    assert parse_call("x call a 1 call calc 2 end".split()) == ("calc", "2")  # the last call counts
    assert parse_call("ans 5 6".split()) is None
    assert parse_call("call end".split()) is None
    assert parse_call("calc 4 end".split()) is None


def _slow(_args):
    time.sleep(5)
    return "late"


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        (lambda a: str(int(a) * 2), ("8", True)),
        (lambda a: 1 / 0, ("error t raised ZeroDivisionError: division by zero", False)),
        (lambda a: 7, ("error t returned int, expected str", False)),
        (lambda a: "two\\nlines", ("two\\nlines", True)),
        (lambda a: "two\nlines", ("two lines", True)),
        (_slow, ("error t timed out after 0.2 s", False)),
    ],
)
def test_tool_failures_are_one_line_observations(tool, expected):
    t0 = time.monotonic()
    assert call_tool({"t": tool}, "t", "4", timeout_s=0.2) == expected
    assert time.monotonic() - t0 < 2  # a hung tool is not waited for
    assert call_tool({"t": tool}, "nope", "4", 0.2) == ("error nope unknown tool; tools: t", False)


class Good:
    stop_ids = (5,)

    def reset(self, prompt):
        return [3, 4]

    def step(self, turn):
        return Step([6], 1.0, False)


def _broken(**overrides):
    cls = type("Broken", (Good,), {k: (lambda self, *a, v=v: v(*a)) for k, v in overrides.items()})
    return make_env(cls, V)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"reset": lambda p: 1 / 0}, "environment Broken.reset raised ZeroDivisionError: division by zero"),
        ({"reset": lambda p: "3 4"}, "environment Broken.reset returned str, expected a list of token ids"),
        ({"reset": lambda p: []}, "environment Broken.reset returned no tokens for prompt 'p'"),
        ({"step": lambda t: [6]}, "environment Broken.step returned list, expected rloo.envs.Step"),
        ({"step": lambda t: Step([V], None, True)}, f"environment Broken.step returned {V} among its token ids"),
        ({"step": lambda t: Step([6], float("nan"), True)}, "environment Broken.step returned reward nan"),
        ({"step": lambda t: Step([6], 1.0, "yes")}, "environment Broken.step returned done='yes'"),
        ({"step": lambda t: Step([6.0], 1.0, True)}, "environment Broken.step returned 6.0 among its token ids"),
    ],
)
def test_broken_environment_is_one_line(overrides, message):
    env = _broken(**overrides)
    with pytest.raises(EnvError) as e:
        env.reset("p")
        env.step([3])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_broken_factory_is_one_line():
    def factory():
        raise OSError("no such board")

    with pytest.raises(EnvError, match=r"^environment factory\(\) raised OSError: no such board$"):
        make_env(factory, V)
    with pytest.raises(EnvError, match="has no step"):
        make_env(lambda: type("NoStep", (), {"reset": lambda self, p: [1]})(), V)


class Tok:
    eos_token_id, pad_token_id = 1, 0

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, r)) for r in rows]


def _run(env_cls, lim, k=2):
    envs = [make_env(env_cls, V) for _ in range(2 * k)]
    gen = torch.Generator().manual_seed(0)
    return episodes(tiny_lm("llama"), Tok(), envs, ["3 4", "5 6 7"], k, lim, Sampling(1, 8), generator=gen)


def test_never_ending_environment_is_truncated_at_max_turns():
    roll = _run(Good, Limits(max_turns=2, max_turn_tokens=3, max_total_tokens=40, step_timeout_s=10))
    assert bool(roll.truncated.all()) and roll.turns.tolist() == [2.0] * 4
    assert roll.env_rewards.tolist() == [2.0] * 4  # the rewards given before the limit count
    # one observation token after each turn but the last (no room for another turn)
    assert ((roll.completion_mask & ~roll.policy_mask).sum(-1) == 1).all()


def test_total_token_limit_cuts_the_episode():
    roll = _run(Good, Limits(max_turns=9, max_turn_tokens=3, max_total_tokens=5, step_timeout_s=10))
    assert bool(roll.truncated.all()) and (roll.completion_mask.sum(-1) <= 5).all()


def test_slow_environment_step_is_one_line():
    class Slow(Good):
        def step(self, turn):
            time.sleep(30)
            return Step([], 0.0, True)

    t0 = time.monotonic()
    with pytest.raises(EnvError, match=r"^environment Slow.step took longer than step_timeout_s=0.3 s$"):
        _run(Slow, Limits(max_turns=2, max_turn_tokens=2, max_total_tokens=8, step_timeout_s=0.3))
    assert time.monotonic() - t0 < 10  # the slow steps (30 s each) were not awaited


def test_env_spec_defaults_are_limits():
    spec = EnvSpec(Good)
    assert spec.max_turns >= 1 and spec.max_total_tokens >= spec.max_turn_tokens


def test_calculator_env_plays_the_ideal_trace():
    """The task's ideal trace, fed turn by turn as token ids, is answered with the tool's exact
    result and scores 1; a malformed call is answered with a one-line error record."""
    task = get_task("calculator")
    tok = build_tokenizer(task)
    prompt = "q : 4 7 * 8 + 6 ="
    env = make_env(lambda: CalculatorEnv(tok), len(tok))
    ids = env.reset(prompt)
    assert tok.decode(ids) == prompt
    call, rest = task.ideal_response(prompt).split(" out ")
    step = env.step(tok(call, add_special_tokens=False)["input_ids"])
    assert tok.decode(step.observation) == "out 3 8 2" == f"out {calculator('4 7 * 8 + 6')}"
    assert (step.reward, step.done) == (None, False)
    answer = tok(rest.split(" ", 3)[-1], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(answer, skip_special_tokens=True) == "ans 3 8 2"
    assert env.step(answer) == Step([], 1.0, True)
    assert env.stats() == {"tool_calls": 1.0, "tool_errors": 0.0}
    env.reset(prompt)
    bad = env.step(tok("call calc 4 * * 8 end", add_special_tokens=False)["input_ids"])
    # the record is one line of text; the word tokenizer knows "error calc" but not the message's words
    assert tok.decode(bad.observation).startswith("out error calc <unk>")
    assert env.stats() == {"tool_calls": 1.0, "tool_errors": 1.0}


def test_special_tokens_inside_a_turn_stay_in_the_parsed_text():
    """A special token inside a policy turn is part of what the environment parses (such a turn is
    malformed), not dropped from it: `ans 3 <pad> 8 2` is not the answer 382. Only one final EOS,
    the token that closed the turn, is left out."""
    tok = build_tokenizer(get_task("calculator"))
    env = make_env(lambda: CalculatorEnv(tok), len(tok))
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = [tok.eos_token_id]
    for turn, reward in [("ans 3 8 2", 1.0), ("ans 3 <pad> 8 2", 0.0), ("ans 3 8 2 <eos>", 0.0)]:
        env.reset("q : 4 7 * 8 + 6 =")
        assert env.step(enc(turn) + eos) == Step([], reward, True), turn
    env.reset("q : 4 7 * 8 + 6 =")
    assert env.step(enc("call calc 4 7 <pad> * 8 + 6 end")).observation[:3] == enc("out error calc")
