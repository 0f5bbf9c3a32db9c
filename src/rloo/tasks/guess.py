"""``guess``: guess a number over several turns, with higher/lower feedback (issue 30's game).

Prompt: ``"game 4 7 1 2 :"``: a four-digit game id from which the secret, a number in 1..16, is
drawn by a hash (``secret``); the policy cannot read it from the id, it has to search. Each policy
turn is ``guess <n>`` (the turn stops at the number, the environment's stop tokens); the
environment (rloo.envs.guess.GuessEnv) answers ``higher`` (the secret is higher) or ``lower``, or
ends the episode when the guess is right, with reward ``DECAY ** (turns - 1)`` (1 on the first
turn, falling with every turn). A turn that is not ``guess <n>`` with n in 1..16 ends the episode
with reward 0, and so does reaching ``max_turns`` (GUESS_TURNS in the pipeline).

    game 4 7 1 2 :   guess 8 higher guess 12 lower guess 10 higher guess 11      (reward 0.85^3)

SFT references are whole traces (the observations included) of a mediocre player: each guess is,
with probability P_FEEDBACK, uniform among the numbers the feedback so far allows, else uniform
among the numbers not yet guessed (feedback ignored). Binary search (``ideal_response``: the middle
of the allowed range) needs at most 5 turns and 3.3 on average (mean reward 0.70); the references
win 86% of their games within 8 turns, in 5.1 turns on average (lost games count 8; mean reward
0.50). RLOO can learn to use the feedback: fewer turns, more games won.
"""

from __future__ import annotations

import random

from rloo.tasks.base import SyntheticTask, stable_hash

LOW, HIGH = 1, 16  # the secret's range
NUMBERS: tuple[str, ...] = tuple(str(n) for n in range(LOW, HIGH + 1))
DIGITS: tuple[str, ...] = tuple("0123456789")  # the game id's
GUESS, HIGHER, LOWER = "guess", "higher", "lower"
GUESS_TURNS = 8  # turns of a game (the pipeline's env_settings.max_turns; the references stop there)
DECAY = 0.85  # reward of a win at turn t: DECAY ** (t - 1)
P_FEEDBACK = 0.5  # share of the references' guesses that use the feedback
EVAL_BUCKETS = 10  # a game id is held out for eval when stable_hash(id) % EVAL_BUCKETS == 0


def game_id(prompt: str) -> str:
    """``"game 4 7 1 2 :"`` -> ``"4712"``; ValueError if the prompt is not a game's."""
    words = prompt.split()
    if len(words) != 6 or words[0] != "game" or words[-1] != ":" or any(w not in DIGITS for w in words[1:-1]):
        raise ValueError(f"not a guess prompt: {prompt!r}")
    return "".join(words[1:-1])


def secret(prompt: str) -> int:
    """The number to guess in a prompt's game, in LOW..HIGH (a hash of the game id)."""
    return LOW + stable_hash(f"guess/secret/{game_id(prompt)}") % (HIGH - LOW + 1)


def parse_guess(words: list[str]) -> int | None:
    """The number of a turn ``guess <n>`` with n in LOW..HIGH; None for any other turn."""
    if len(words) != 2 or words[0] != GUESS or words[1] not in NUMBERS:
        return None
    return int(words[1])


def feedback(target: int, guess: int) -> str | None:
    """The environment's answer to a wrong guess (``higher``: the secret is higher); None if right."""
    return None if guess == target else (HIGHER if target > guess else LOWER)


def win_reward(turns: int) -> float:
    """Reward of a game won at turn `turns` (>= 1): DECAY ** (turns - 1)."""
    return DECAY ** (turns - 1)


def play(prompt: str, response: str, max_turns: int = GUESS_TURNS) -> tuple[float, int]:
    """Replay a whole trace (turns and observations as text) against the rules -> (reward, turns):
    the reward of the first right guess, 0 when a turn is malformed or the game is not won within
    max_turns."""
    words, target = response.split(), secret(prompt)
    turns, i = 0, 0
    while i < len(words) and turns < max_turns:
        turns += 1
        guess = parse_guess(words[i : i + 2])
        if guess is None:
            return 0.0, turns
        if guess == target:
            return win_reward(turns), turns
        i += 3  # guess <n> <feedback>
    return 0.0, turns


def allowed(history: list[tuple[int, str]]) -> list[int]:
    """The numbers the feedback so far allows (history: (guess, answer) pairs), not yet guessed."""
    lo = max([g + 1 for g, a in history if a == HIGHER], default=LOW)
    hi = min([g - 1 for g, a in history if a == LOWER], default=HIGH)
    tried = {g for g, _ in history}
    return [n for n in range(lo, hi + 1) if n not in tried]


def trace(prompt: str, choose) -> str:
    """A game played by `choose(history) -> guess` up to GUESS_TURNS, as text (the reference layout)."""
    target, history, words = secret(prompt), [], []
    for _ in range(GUESS_TURNS):
        g = choose(history)
        words += [GUESS, str(g)]
        answer = feedback(target, g)
        if answer is None:
            break
        words.append(answer)
        history.append((g, answer))
    return " ".join(words)


class GuessTask(SyntheticTask):
    """Guess a number in 1..16 with higher/lower feedback: episodes with rloo.envs.guess.GuessEnv."""

    name = "guess"
    max_prompt_words = 6
    max_response_words = 3 * GUESS_TURNS
    success_threshold = 1e-9  # a won game scores > 0 (rloo.eval.episodes)

    def sample_prompt(self, rng: random.Random, held_out: bool) -> str:
        while True:
            gid = f"{rng.randrange(10000):04d}"
            if (stable_hash(gid) % EVAL_BUCKETS == 0) == held_out:
                return f"game {' '.join(gid)} :"

    def ideal_response(self, prompt: str) -> str:
        """Binary search: the middle of the allowed range."""
        return trace(prompt, lambda h: (lambda a: a[(len(a) - 1) // 2])(allowed(h)))

    def sample_reference(self, prompt: str, rng: random.Random) -> str:
        def choose(history):
            pool = allowed(history) if rng.random() < P_FEEDBACK else None
            tried = {g for g, _ in history}
            return rng.choice(pool or [n for n in range(LOW, HIGH + 1) if n not in tried])

        return trace(prompt, choose)

    def environment_words(self, reference: str) -> list[bool]:
        """The environment's answers, ``higher`` and ``lower`` (the policy writes ``guess <n>``)."""
        return [w in (HIGHER, LOWER) for w in reference.split(" ")]

    def gold_score(self, prompt: str, response: str) -> float:
        """The reward of the trace as played (rloo.envs.guess.GuessEnv gives the same); 0 for a prompt
        that is not a game's."""
        try:
            return play(prompt, response)[0]
        except ValueError:
            return 0.0

    def words(self) -> list[str]:
        return list(dict.fromkeys(["game", ":", GUESS, HIGHER, LOWER, *DIGITS, *NUMBERS]))
