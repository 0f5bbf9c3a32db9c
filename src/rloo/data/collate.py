"""Token layout shared by every stage.

A batch is `prompt_ids` (N, P) LEFT-padded and `completion_ids` (N, T) RIGHT-padded, so
that the prompt's last token sits at column P-1 for every row and completions start at P.
Masks are bool, True = a real token that counts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.errors import RlooError


@dataclass
class Encoded:
    ids: Tensor  # (N, L) long
    mask: Tensor  # (N, L) bool, True on real tokens
    cut: int = 0  # rows that lost tokens of their text to max_len (prompts their first, completions their last)
    eos_cut: int = 0  # completion rows whose appended EOS did not fit (every cut row among them)
    longest: int = 0  # the longest row before the cut, in tokens (a completion's EOS included)


def encode_prompts(tokenizer, texts: list[str], max_len: int) -> tuple[Encoded, int]:
    """Left-padded prompts. Prompts longer than max_len keep their LAST max_len tokens (the
    response cue sits at the end). Returns the batch and the number of prompts truncated."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    truncated, longest = sum(len(r) > max_len for r in rows), max((len(r) for r in rows), default=0)
    rows = [r[-max_len:] for r in rows]
    empty = [i for i, r in enumerate(rows) if not r]
    if empty:
        raise RlooError(
            f"prompt {texts[empty[0]]!r} encodes to zero tokens ({len(empty)} such prompts); "
            f"remove empty prompts from the data"
        )
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = True
    return Encoded(ids, mask, cut=truncated, longest=longest), truncated


def encode_completions(tokenizer, texts: list[str], max_len: int, add_eos: bool = True) -> Encoded:
    """Right-padded completions ending with EOS (when it fits in max_len: `Encoded.eos_cut` counts
    the rows where it did not, `Encoded.cut` those that lost text too; rloo.data.lengths reports them)."""
    rows, cut, eos_cut, longest = [], 0, 0, 0
    for t in texts:
        r = tokenizer(t, add_special_tokens=False)["input_ids"]
        cut += len(r) > max_len
        if add_eos:
            r = r + [tokenizer.eos_token_id]
            eos_cut += len(r) > max_len
        longest = max(longest, len(r))
        rows.append(r[:max_len])
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return Encoded(ids, mask, cut=cut, eos_cut=eos_cut, longest=longest)


def environment_token_mask(tokenizer, texts: list[str], env_words: list[list[bool]], enc: Encoded) -> Tensor:
    """(N, L) bool: True on the tokens of `enc` (encode_completions of `texts`) that fall in a word the
    environment wrote: env_words[i][j] for word j of texts[i], words separated by single spaces
    (rloo.tasks.base.SyntheticTask.environment_words). A token overlapping such a word counts as the
    environment's; EOS and padding never do. Needs a fast tokenizer (its character offsets)."""
    out = torch.zeros_like(enc.mask)
    for i, (text, flags) in enumerate(zip(texts, env_words, strict=True)):
        words = text.split(" ")
        if len(flags) != len(words):
            raise ValueError(f"{len(flags)} environment flags for the {len(words)} words of {text!r}")
        starts = itertools.accumulate((len(w) + 1 for w in words[:-1]), initial=0)  # each word's first char
        spans = [(a, a + len(w)) for a, w, env in zip(starts, words, flags, strict=True) if env]
        if not spans:
            continue
        try:
            offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        except NotImplementedError:
            raise RlooError(
                "SFT on episode traces needs a fast tokenizer (its character offsets tell the environment's "
                "words from the policy's); this one is a slow (Python) tokenizer"
            ) from None
        for j, (a, b) in enumerate(offsets[: enc.ids.shape[1]]):
            out[i, j] = any(s < b and a < e for s, e in spans)
    return out & enc.mask


def position_ids(mask: Tensor) -> Tensor:
    """Positions counted over real tokens only, so left padding does not shift them. (N, L)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def batches(n: int, size: int, generator: torch.Generator | None = None, shuffle: bool = True):
    """Index batches over range(n), shuffled with `generator`."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for i in range(0, n, size):
        yield order[i : i + size]


def trim_left(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Drop columns that are padding in every row of a LEFT-padded batch (a sub-batch of a
    dataset padded to its longest prompt would otherwise pay for it)."""
    real = mask.any(0).nonzero()
    start = int(real[0]) if len(real) else ids.shape[1] - 1
    return ids[:, start:], mask[:, start:]


def trim_right(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Drop columns that are padding in every row of a RIGHT-padded batch."""
    end = int(mask.sum(-1).max().clamp(min=1))
    return ids[:, :end], mask[:, :end]
