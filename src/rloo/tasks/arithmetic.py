"""``arithmetic``: small integer problems scored by a checker (RL with verifiable rewards).

Prompt: ``"q : <expression> ="`` with numbers written digit by digit (one token per digit), e.g.
``"q : 4 7 + 8 ="``. Four kinds of problem, a difficulty mix (share of prompts in brackets):

    add1   a + b,      a, b in 0..9          ``3 + 5``          (25%)
    add2   a + b,      a in 10..99, b 0..9   ``4 7 + 8``        (35%, a carry half the time)
    mul    a * b,      a, b in 2..9          ``6 * 7``          (20%)
    chain  a + b - c,  a, b, c in 0..9       ``7 + 6 - 4``      (20%, result may be negative)

A response ends with its final answer: ``"ans 5 5"``. A *worked* response writes the steps first:
``"4 7 + 8 = 5 5 ans 5 5"``; for a chain ``"7 + 6 = 1 3 1 3 - 4 = 9 ans 9"``.

The checker (``parse_answer``, ``check``) reads the digits after the last ``ans``, with an optional
leading ``-``; anything else after them, no ``ans`` or no digits makes the response *unparseable*,
which scores 0 like a wrong answer (``check``) and is counted apart by the pass@k evaluation. There
is no reward model: the checker is the reward (``reward``, usable as ``reward_fn``) and the gold
judge (``gold_score``, 1 or 0), so the labeler's preferences are only used for diagnostics.

References (SFT data) are of mixed correctness like human solutions: a share are wrong (off by one,
off by ten, a digit dropped), more often for the harder kinds, and a share use the worked form
(whose steps may carry the error). An SFT model imitating them answers some problems and misses most
of the hard ones, yet often has the right answer among a few samples: the gap between pass@1 and
pass@8 that RL with a checker can close. Held-out problems (eval split: one in ten, by a hash of the
expression; 219 distinct, mostly add2 and chain) are never in the other splits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from itertools import product

from rloo.tasks.base import Example, SyntheticTask, check_split, stable_hash

DIGITS: tuple[str, ...] = tuple("0123456789")
OPS: tuple[str, ...] = ("+", "-", "*")
ANSWER = "ans"
SCAFFOLD: tuple[str, ...] = ("q", ":", "=", ANSWER)

KINDS: dict[str, float] = {"add1": 0.25, "add2": 0.35, "mul": 0.20, "chain": 0.20}
EVAL_BUCKETS = 10  # a problem is held out for eval when stable_hash(expression) % EVAL_BUCKETS == 0

# Reference generator: probability that a reference's final answer is wrong, per kind (the harder,
# the more often), and that it shows its work.
P_WRONG: dict[str, float] = {"add1": 0.2, "add2": 0.4, "mul": 0.45, "chain": 0.5}
P_WORKED = 0.3


def digits(n: int) -> list[str]:
    """``-12`` -> ``["-", "1", "2"]``: one token per digit, a leading ``-`` for negatives."""
    return (["-"] if n < 0 else []) + list(str(abs(n)))


def _number(tokens: Sequence[str]) -> int | None:
    """The integer written by ``tokens`` (digits, optional leading ``-``), or None."""
    body = tokens[1:] if tokens[:1] == ["-"] else tokens
    if not body or any(t not in DIGITS for t in body):
        return None
    value = int("".join(body))
    return -value if tokens[:1] == ["-"] else value


def expression(prompt: str) -> list[str]:
    """The expression tokens of a prompt: between ``q :`` and ``=``. ValueError if it is not
    one: numbers of digits separated by single + - * signs."""
    words = prompt.split()
    expr = words[2:-1]
    ops = [i for i, w in enumerate(expr) if w in OPS]
    bounds = [-1, *ops, len(expr)]
    if (
        words[:2] != ["q", ":"]
        or words[-1:] != ["="]
        or any(w not in DIGITS and w not in OPS for w in expr)
        or any(b - a < 2 for a, b in zip(bounds, bounds[1:], strict=False))
    ):
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    return expr


def evaluate(tokens: Sequence[str]) -> int:
    """Value of an expression of digit-token numbers and + - * (``*`` binds tighter)."""
    terms: list[int] = []  # the sum's terms, signed
    number: list[str] = []
    sign, product = 1, None
    for tok in [*tokens, "+"]:
        if tok in DIGITS:
            number.append(tok)
            continue
        value = int("".join(number))
        number = []
        product = value if product is None else product * value
        if tok == "*":
            continue
        terms.append(sign * product)
        sign, product = (1 if tok == "+" else -1), None
    return sum(terms)


def answer(prompt: str) -> int:
    """The correct answer of a prompt."""
    return evaluate(expression(prompt))


def parse_answer(response: str) -> int | None:
    """The final answer of a response: the number after its last ``ans``; None if unparseable."""
    words = response.split()
    if ANSWER not in words:
        return None
    last = len(words) - 1 - words[::-1].index(ANSWER)
    return _number(words[last + 1 :])


def check(prompt: str, response: str) -> float:
    """1.0 if the response's final answer is the prompt's value, else 0.0 (unparseable too, and
    any response to a prompt that is not an arithmetic problem: there is nothing to check)."""
    try:
        truth = answer(prompt)
    except ValueError:
        return 0.0
    return float(parse_answer(response) == truth)


def reward(prompts: list[str], completions: list[str]) -> list[float]:
    """The checker as a batched reward function: ``reward_fn=rloo.tasks.arithmetic:reward``."""
    return [check(p, c) for p, c in zip(prompts, completions, strict=False)]


def _problem(kind: str, rng: random.Random) -> list[str]:
    """Expression tokens of a random problem of ``kind`` (operands uniform in ``_ranges(kind)``)."""
    values = [rng.choice(r) for r in _ranges(kind)]
    ops = {"add1": ["+"], "add2": ["+"], "mul": ["*"], "chain": ["+", "-"]}[kind]
    expr = digits(values[0])
    for op, v in zip(ops, values[1:], strict=False):
        expr += [op, *digits(v)]
    return expr


def _ranges(kind: str) -> list[range]:
    return {
        "add1": [range(10)] * 2,
        "add2": [range(10, 100), range(10)],
        "mul": [range(2, 10)] * 2,
        "chain": [range(10)] * 3,
    }[kind]


def _held_out(expr: Sequence[str]) -> bool:
    return stable_hash(" ".join(expr)) % EVAL_BUCKETS == 0


@lru_cache(maxsize=1)
def held_out_count() -> int:
    """How many distinct problems the eval split holds (219): more eval prompts repeat some."""
    ops = {"add1": ["+"], "add2": ["+"], "mul": ["*"], "chain": ["+", "-"]}
    count = 0
    for kind in KINDS:
        for values in product(*_ranges(kind)):
            expr = [*digits(values[0])]
            for op, v in zip(ops[kind], values[1:], strict=False):
                expr += [op, *digits(v)]
            count += _held_out(expr)
    return count


def kind_of(prompt: str) -> str:
    """Which of ``KINDS`` a prompt is."""
    expr = expression(prompt)
    if "*" in expr:
        return "mul"
    if "-" in expr:
        return "chain"
    return "add2" if expr.index("+") == 2 else "add1"


def _wrong(value: int, rng: random.Random) -> int:
    """A plausible wrong answer (never ``value``): off by one, off by ten (two for one digit), or a
    digit dropped."""
    r = rng.random()
    if r < 0.5 or (r >= 0.8 and abs(value) < 10):
        return value + rng.choice((-1, 1))
    if r < 0.8:
        return value + rng.choice((-10, 10) if abs(value) >= 10 else (-2, 2))
    text = str(abs(value))
    i = rng.randrange(len(text))
    return int(text[:i] + text[i + 1 :]) * (-1 if value < 0 else 1)


def _worked(expr: list[str], final: int) -> list[str]:
    """Worked steps ending in ``final``: a chain's first sum, then the expression's result."""
    if "-" in expr and "+" in expr:
        minus = expr.index("-")
        first = evaluate(expr[:minus])
        return [*expr[:minus], "=", *digits(first), *digits(first), *expr[minus:], "=", *digits(final)]
    return [*expr, "=", *digits(final)]


class ArithmeticTask(SyntheticTask):
    """Small integer problems with a checker as the reward (RLVR stand-in; no reward model)."""

    name = "arithmetic"
    max_prompt_words = 2 + 7 + 1  # "q :" + the longest expression (2-digit + 1-digit, or a chain) + "="
    max_response_words = 20

    def sample_prompt(self, rng: random.Random, held_out: bool) -> str:
        kinds, weights = zip(*KINDS.items(), strict=False)
        while True:
            expr = _problem(rng.choices(kinds, weights)[0], rng)
            if _held_out(expr) == held_out:
                return f"q : {' '.join(expr)} ="

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """As ``SyntheticTask.examples``, but the eval split holds distinct problems (there are only
        ``held_out_count()``; past that many, problems repeat), so that intervals over eval problems
        treat independent problems. A prefix of a longer draw equals the shorter draw."""
        if split != "eval":
            return super().examples(split, n, seed)
        check_split(split, n)
        rng = random.Random(f"rloo.tasks/{self.name}/{split}/{seed}")
        out, seen = [], set()
        while len(out) < n:
            prompt = self.sample_prompt(rng, held_out=True)
            if prompt in seen and len(seen) < held_out_count():
                continue
            seen.add(prompt)
            out.append(Example(prompt=prompt, reference=self.sample_reference(prompt, rng)))
        return out

    def ideal_response(self, prompt: str) -> str:
        return " ".join([ANSWER, *digits(answer(prompt))])

    def sample_reference(self, prompt: str, rng: random.Random) -> str:
        expr, value = expression(prompt), answer(prompt)
        final = _wrong(value, rng) if rng.random() < P_WRONG[kind_of(prompt)] else value
        steps = _worked(expr, final) if rng.random() < P_WORKED else []
        return " ".join([*steps, ANSWER, *digits(final)])

    @staticmethod
    def parse_answer(response: str) -> int | None:
        """The final answer, None when unparseable (counted apart by the pass@k evaluation)."""
        return parse_answer(response)

    def gold_score(self, prompt: str, response: str) -> float:
        """The checker: 1.0 for the right final answer, 0.0 otherwise (unparseable included)."""
        return check(prompt, response)

    def words(self) -> list[str]:
        return list(dict.fromkeys([*SCAFFOLD, *DIGITS, *OPS]))
