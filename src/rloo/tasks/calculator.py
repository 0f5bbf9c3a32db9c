"""``calculator``: multi-step arithmetic where the policy may call a calculator tool (issue 30).

Prompt: ``"q : 4 7 * 8 + 6 ="`` (a two-digit number times a digit, plus a digit; one token per
digit), too hard for a small model to answer from memory most of the time. The policy may answer
at once (``"ans 3 8 2"``) or call the tool first, in the format of rloo.envs.tools:

    policy:       call calc 4 7 * 8 + 6 end
    environment:  out 3 8 2
    policy:       ans 3 8 2 <eos>

The reward is the arithmetic checker on the final turn (1 for the right number after ``ans``, else
0); the built-in environment is rloo.envs.calculator.CalculatorEnv. SFT references are whole
traces in that layout, mixed like arithmetic's: a share P_TOOL use the tool (and are right), the
others answer from memory and are wrong P_WRONG of the time; the pipeline's SFT trains on the
policy's words only (sft.observation_loss=false; `environment_words` names the observation). The SFT
model therefore calls the tool sometimes; RLOO on episodes can learn to call it always.
"""

from __future__ import annotations

import random

from rloo.tasks.arithmetic import (
    ANSWER,
    DIGITS,
    OPS,
    _held_out,
    _wrong,
    check,
    digits,
    evaluate,
    expression,
    parse_answer,
)
from rloo.tasks.base import SyntheticTask

TOOL = "calc"
CALL, END, OUT, ERROR = "call", "end", "out", "error"  # rloo.envs.tools' format (a lower layer: not imported)
TOOL_WORDS = (CALL, TOOL, END, OUT, ERROR)  # rloo.envs.tools.WORDS and the tool's name
P_TOOL = 0.5  # share of SFT traces that call the tool
P_WRONG = 0.6  # share of the other (memory) answers that are wrong


def calculator(args: str) -> str:
    """The tool: an expression of digit tokens and + - * -> its value in digit tokens. ValueError on
    anything else (the environment turns that into a one-line error observation)."""
    words = args.split()
    if not words or any(w not in DIGITS and w not in OPS for w in words) or words[0] in OPS or words[-1] in OPS:
        raise ValueError(f"not an expression: {args!r}")
    if any(a in OPS and b in OPS for a, b in zip(words, words[1:], strict=False)):
        raise ValueError(f"two operators in a row: {args!r}")
    return " ".join(digits(evaluate(words)))


def answer(prompt: str) -> int:
    return evaluate(expression(prompt))


class CalculatorTask(SyntheticTask):
    """Arithmetic with a calculator tool: episodes with an environment (rloo.envs.calculator)."""

    name = "calculator"
    max_prompt_words = 2 + 6 + 1
    max_response_words = 9 + 4 + 4  # call ... end, out + 3 digits, ans + 3 digits
    success_threshold = 1.0  # the checker's right answer (rloo.eval.episodes)

    def sample_prompt(self, rng: random.Random, held_out: bool) -> str:
        while True:
            expr = [
                *digits(rng.randrange(10, 100)),
                "*",
                *digits(rng.randrange(2, 10)),
                "+",
                *digits(rng.randrange(10)),
            ]
            if _held_out(expr) == held_out:
                return f"q : {' '.join(expr)} ="

    def ideal_response(self, prompt: str) -> str:
        expr, value = " ".join(expression(prompt)), " ".join(digits(answer(prompt)))
        return f"call {TOOL} {expr} end out {value} {ANSWER} {value}"

    def sample_reference(self, prompt: str, rng: random.Random) -> str:
        if rng.random() < P_TOOL:
            return self.ideal_response(prompt)
        value = answer(prompt)
        final = _wrong(value, rng) if rng.random() < P_WRONG else value
        return " ".join([ANSWER, *digits(final)])

    def environment_words(self, reference: str) -> list[bool]:
        """The observations: from each ``out`` or ``error`` after a call's ``end`` up to the policy's
        next ``call`` or ``ans``."""
        flags, env = [], False
        for i, w in enumerate(words := reference.split(" ")):
            env = (env or (w in (OUT, ERROR) and i > 0 and words[i - 1] == END)) and w not in (CALL, ANSWER)
            flags.append(env)
        return flags

    def gold_score(self, prompt: str, response: str) -> float:
        """The checker on the final answer (the words after the last ``ans``)."""
        return check(prompt, response)

    @staticmethod
    def parse_answer(response: str) -> int | None:
        return parse_answer(response)

    def words(self) -> list[str]:
        return list(dict.fromkeys(["q", ":", "=", ANSWER, *DIGITS, *OPS, *TOOL_WORDS]))
