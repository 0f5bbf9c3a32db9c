"""The guess-a-number game's environment (rloo.tasks.guess): higher/lower feedback over turns."""

from __future__ import annotations

from rloo.envs.base import Step, turn_text
from rloo.tasks.guess import NUMBERS, feedback, parse_guess, secret, win_reward


class GuessEnv:
    """One game: a turn ``guess <n>`` (it stops at the number) is answered ``higher`` or ``lower``,
    or ends the episode with reward DECAY ** (turns - 1) when n is the secret; any other turn ends
    it with reward 0. The turn limit is env_settings.max_turns (a game not won there scores 0).
    `tool_calls` stays 0 (no tools); `guesses` counts the turns played."""

    def __init__(self, tokenizer, timeout_s: float = 1.0, end_ids: frozenset[int] | None = None):
        del timeout_s  # no tools to time out
        self.tokenizer = tokenizer
        self.end_ids = frozenset({tokenizer.eos_token_id}) if end_ids is None else end_ids
        self.stop_ids = tokenizer.convert_tokens_to_ids(["0", *NUMBERS])  # any number ends a turn
        self.prompt, self.turns = "", 0

    def reset(self, prompt: str) -> list[int]:
        self.prompt, self.turns = prompt, 0
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def step(self, turn: list[int]) -> Step:
        self.turns += 1
        guess = parse_guess(turn_text(self.tokenizer, turn, self.end_ids).split())  # to parse only
        if guess is None:
            return Step([], 0.0, True)
        answer = feedback(secret(self.prompt), guess)
        if answer is None:
            return Step([], win_reward(self.turns), True)
        return Step(self.tokenizer(answer, add_special_tokens=False)["input_ids"], None, False)
