"""The training prompts: checked once, then drawn in reshuffled epochs."""

from __future__ import annotations

import random
from collections.abc import Mapping

from rloo.data.columns import extra_columns, with_columns
from rloo.errors import RlooError


class PromptStream:
    """Prompts in reshuffled epochs; its position is part of the checkpoint for exact resume."""

    def __init__(self, prompts: list[str], batch_size: int, seed: int):
        self.prompts, self.batch_size, self.seed = check_prompts(prompts), batch_size, seed
        self.epoch, self.pos = 0, 0

    def position(self) -> tuple[int, int]:
        return self.epoch, self.pos

    def seek(self, epoch: int, pos: int) -> None:
        self.epoch, self.pos = epoch, pos

    def _order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self) -> list[str]:
        out: list[str] = []
        while len(out) < self.batch_size:
            order = self._order()
            take = order[self.pos : self.pos + self.batch_size - len(out)]
            out += [self.prompts[i] for i in take]
            self.pos += len(take)
            if self.pos >= len(order):
                self.epoch, self.pos = self.epoch + 1, 0
        return out


def check_prompts(prompts) -> list[str]:
    """The training prompts, or a clear error naming the first bad one. A row (a mapping with a
    `prompt`) gives its prompt holding the row's other columns (rloo.data.columns)."""
    prompts = [_of_row(p, i) if isinstance(p, Mapping) else p for i, p in enumerate(prompts)]
    if not prompts:
        raise RlooError("no training prompts: the prompt list is empty; pass at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise RlooError(f"prompt {i} is a {type(p).__name__}, expected a string")
        if not p.strip():
            raise RlooError(f"prompt {i} is empty; remove empty prompts from the data")
    return prompts


def _of_row(row: Mapping, i: int) -> str:
    if "prompt" not in row:
        raise RlooError(f"prompt {i} is a row without a 'prompt' key (keys: {', '.join(map(str, row))})")
    if not isinstance(row["prompt"], str):
        raise RlooError(f"prompt {i}'s 'prompt' is a {type(row['prompt']).__name__}, expected a string")
    return with_columns(row["prompt"], extra_columns(row, {"prompt"}))
