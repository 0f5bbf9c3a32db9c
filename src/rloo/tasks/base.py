"""The task interface shared by the built-in synthetic tasks, and the pieces they share.

A task is the whole RLHF world at laptop scale: it makes prompts, a *mixed-quality* reference
response per prompt (what the SFT model imitates), a deterministic gold judge (the ground truth
we measure progress with, standing in for the paper's GPT-4 judge), and a simulated labeler that
turns the gold judge into *noisy* pairwise preferences (what the reward model learns from).

Why the references are mixed: the paper's SFT model imitates human-written TL;DRs and HH
responses of uneven quality, so a policy that imitates them perfectly ties with them (win rate
0.5) and RL has room to climb towards the ideal response. The tasks reproduce that gap:
``task_stats`` measures it (ideal vs reference win rate is the ceiling a perfect policy reaches).

Why the labeler is noisy: preferences follow the Bradley-Terry model
``P(a preferred) = sigmoid((gold(a) - gold(b)) / temperature)``, which is exactly the model a
reward model is fit with, so a reward model can recover the gold ordering from enough pairs but
no single pair is trustworthy.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

SPLITS: tuple[str, ...] = ("sft", "pref", "train", "eval", "valid")
"""sft: SFT data; pref: prompts for preference pairs; train: RL prompts; eval: held-out prompts;
valid: validation prompts for tuning (`rloo compare`), drawn like the non-eval splits (their own
stream), so never an eval prompt; a task's prompt space may be small enough that they repeat
training prompts (dialogue: 20 per topic)."""

DEFAULT_LABEL_TEMPERATURE = 0.3
"""Bradley-Terry temperature of the simulated labeler, in gold-score units (gold is roughly in
[-1, 1]): a gold gap of 0.15 (one filler word) is preferred 62% of the time, a gap of 0.5 84%,
a gap of 1 97%. On pairs of references it agrees with the gold ordering ~80-85% of the time."""

TIE_TOLERANCE = 1e-9
"""Gold scores closer than this are a tie (half a win)."""


@dataclass(frozen=True)
class Example:
    """One prompt with one reference response.

    prompt: model input text, ends with the response cue (e.g. ``"post : ... tl;dr :"``).
    reference: one reference response for this prompt, of mixed quality, drawn once (fixed by the
        seed of ``Task.examples``).
    """

    prompt: str
    reference: str


@runtime_checkable
class Task(Protocol):
    """A synthetic RLHF task. Texts are lowercase words separated by single spaces."""

    name: str
    max_prompt_words: int
    max_response_words: int

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """``n`` examples of ``split`` (one of ``SPLITS``), deterministic given (split, n, seed).

        Eval prompts never appear in the other splits. Raises ValueError on an unknown split or
        ``n < 1``.
        """
        ...

    def sample_reference(self, prompt: str, rng: random.Random) -> str:
        """A fresh mixed-quality reference response (same distribution as ``Example.reference``)."""
        ...

    def gold_score(self, prompt: str, response: str) -> float:
        """Deterministic ground-truth quality, roughly in [-1, 1] (1 = ideal). Any string works."""
        ...

    def label(
        self,
        prompt: str,
        a: str,
        b: str,
        rng: random.Random,
        temperature: float = DEFAULT_LABEL_TEMPERATURE,
    ) -> tuple[str, str]:
        """Simulated labeler: returns (chosen, rejected), ``a`` chosen with probability
        ``sigmoid((gold(a) - gold(b)) / temperature)``."""
        ...

    def words(self) -> list[str]:
        """Every word a prompt or response of this task can contain (for the tokenizer)."""
        ...

    def ideal_response(self, prompt: str) -> str:
        """A response with the highest gold score for ``prompt`` (used by tests and diagnostics)."""
        ...


@runtime_checkable
class ParsesAnswers(Protocol):
    """A checker task that reads a response's final answer (arithmetic, calculator): pass@k counts the
    unparseable apart."""

    def parse_answer(self, response: str) -> int | None: ...


@runtime_checkable
class MarksEnvironmentWords(Protocol):
    """A task whose episode traces hold the environment's words (calculator): which reference words
    the environment wrote, one flag per word, so SFT can leave them out of its loss."""

    def environment_words(self, reference: str) -> list[bool]: ...


@runtime_checkable
class EpisodeSuccess(Protocol):
    """A task played as episodes (calculator, guess): the return at which an episode is a success."""

    success_threshold: float


def sigmoid(x: float) -> float:
    """Numerically safe logistic function."""
    x = max(-60.0, min(60.0, x))
    return 1.0 / (1.0 + math.exp(-x))


def stable_hash(text: str) -> int:
    """A hash that, unlike ``hash()``, does not change between Python processes."""
    return zlib.crc32(text.encode("utf-8"))


def check_split(split: str, n: int) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")


class SyntheticTask:
    """Shared behaviour of the built-in tasks: sampling examples per split and the labeler.

    Subclasses provide ``sample_prompt(rng, held_out)`` (a prompt from the eval partition when
    ``held_out`` is true, from the rest otherwise), ``sample_reference``, ``gold_score``,
    ``ideal_response`` and ``words``.
    """

    name: str = ""
    max_prompt_words: int = 0
    max_response_words: int = 0

    def sample_prompt(self, rng: random.Random, held_out: bool) -> str:
        raise NotImplementedError

    def sample_reference(self, prompt: str, rng: random.Random) -> str:
        raise NotImplementedError

    def gold_score(self, prompt: str, response: str) -> float:
        raise NotImplementedError

    def environment_words(self, reference: str) -> list[bool]:
        """Per word of `reference`, whether the environment wrote it (an observation in an episode
        trace): with sft.observation_loss=false SFT leaves those words out of its loss, as RL leaves
        observations out of its own (rloo.data.collate.environment_token_mask). Single-turn: none."""
        return [False] * len(reference.split(" "))

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        check_split(split, n)
        # A string seed is hashed with SHA-512 by `random`, so this is stable across processes;
        # each split gets its own stream, so sft/pref/train prompts differ for the same seed.
        rng = random.Random(f"rloo.tasks/{self.name}/{split}/{seed}")
        out = []
        for _ in range(n):
            prompt = self.sample_prompt(rng, held_out=split == "eval")
            out.append(Example(prompt=prompt, reference=self.sample_reference(prompt, rng)))
        return out

    def label(
        self,
        prompt: str,
        a: str,
        b: str,
        rng: random.Random,
        temperature: float = DEFAULT_LABEL_TEMPERATURE,
    ) -> tuple[str, str]:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        p_a = sigmoid((self.gold_score(prompt, a) - self.gold_score(prompt, b)) / temperature)
        return (a, b) if rng.random() < p_a else (b, a)


def win_rate(task: Task, prompts: Sequence[str], responses: Sequence[str], references: Sequence[str]) -> float:
    """Fraction of prompts where ``gold(response) > gold(reference)``; a tie counts one half.

    Scores within ``TIE_TOLERANCE`` are ties, so float noise in the judge never decides a win.
    """
    if not (len(prompts) == len(responses) == len(references)):
        raise ValueError(
            f"lengths differ: {len(prompts)} prompts, {len(responses)} responses, {len(references)} references"
        )
    if not prompts:
        raise ValueError("win_rate needs at least one prompt")
    total = 0.0
    for prompt, response, reference in zip(prompts, responses, references, strict=False):
        diff = task.gold_score(prompt, response) - task.gold_score(prompt, reference)
        total += 0.5 if abs(diff) <= TIE_TOLERANCE else float(diff > 0)
    return total / len(prompts)


def task_stats(
    task: Task, n: int = 2000, seed: int = 0, temperature: float = DEFAULT_LABEL_TEMPERATURE
) -> dict[str, float]:
    """Design diagnostics of a task on ``n`` eval examples.

    gold/reference, gold/ideal: mean gold score of the references and of the ideal responses.
    reference/ideal_frac: fraction of references that score as well as the ideal response.
    win/fresh_vs_reference: a fresh ``sample_reference`` against the fixed references (~0.5 by
        symmetry: what a policy that perfectly imitates the references reaches).
    win/ideal_vs_reference: the ideal response against the references (the ceiling of RL).
    label/agreement: fraction of labeler decisions on two fresh references of the same prompt
        that agree with the gold ordering (gold ties excluded); label/expected_agreement: the same
        predicted by the Bradley-Terry model; label/tie_frac: fraction of pairs that tie.
    """
    examples = task.examples("eval", n, seed)
    rng = random.Random(f"rloo.tasks.stats/{task.name}/{seed}")
    prompts = [ex.prompt for ex in examples]
    refs = [ex.reference for ex in examples]
    ideals = [task.ideal_response(p) for p in prompts]
    fresh = [task.sample_reference(p, rng) for p in prompts]
    ref_gold = [task.gold_score(p, r) for p, r in zip(prompts, refs, strict=False)]
    ideal_gold = [task.gold_score(p, r) for p, r in zip(prompts, ideals, strict=False)]
    agree, expected, ties = 0, 0.0, 0
    for p in prompts:
        a, b = task.sample_reference(p, rng), task.sample_reference(p, rng)
        diff = task.gold_score(p, a) - task.gold_score(p, b)
        if abs(diff) <= TIE_TOLERANCE:
            ties += 1
            continue
        chosen, _ = task.label(p, a, b, rng, temperature)
        agree += (chosen == a) == (diff > 0)
        expected += sigmoid(abs(diff) / temperature)
    untied = max(1, n - ties)
    return {
        "gold/reference": sum(ref_gold) / n,
        "gold/ideal": sum(ideal_gold) / n,
        "reference/ideal_frac": sum(r >= i - TIE_TOLERANCE for r, i in zip(ref_gold, ideal_gold, strict=False)) / n,
        "win/fresh_vs_reference": win_rate(task, prompts, fresh, refs),
        "win/ideal_vs_reference": win_rate(task, prompts, ideals, refs),
        "label/agreement": agree / untied,
        "label/expected_agreement": expected / untied,
        "label/tie_frac": ties / n,
    }
