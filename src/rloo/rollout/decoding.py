"""What the sampler does to the logits before it draws, besides the temperature: Hugging Face's
`repetition_penalty`, `min_new_tokens`, `top_k`, rloo's `top_p`, greedy decoding (temperature 0),
and stop strings. Pure functions on (N, V) logits; docs/configs.md, "Sampling settings and the
log-probs", says which of them make the sample off-policy.

Order, as in `transformers`' `generate`: repetition penalty and min_new_tokens on the raw logits,
then temperature, top_k, top_p. The log-probs the sampler stores are log softmax(logits / T) of the
raw logits (T = 1 for greedy), or with rl.logprobs_under=truncated the log-probs of the top-k/top-p
truncated, renormalised distribution it drew from (rloo.core.truncation): either way the quantity
the trainer recomputes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.config import Sampling
from rloo.core.truncation import Truncation, dropped_mask


def logprob_temperature(temperature: float) -> float:
    """The temperature of the stored and recomputed log-probs: T, or 1 for greedy decoding (T = 0),
    whose point-mass distribution has no finite log-probs to compare with a reference model's."""
    return temperature if temperature > 0 else 1.0


def truncate(logits: Tensor, s: Sampling) -> Tensor:
    """The logits of the distribution drawn from: -inf outside K(s), the tokens that top_k (Hugging
    Face's TopKLogitsWarper: ties at the boundary stay) and then top_p keep, as `s` asks; the logits
    themselves when `s` truncates nothing. K(s) is the complement of `rloo.core.truncation.dropped_mask`,
    the set of the trainer's pi_K too. (N,V) -> (N,V)."""
    if s.top_k == 0 and s.top_p == 1.0:
        return logits
    return logits.masked_fill(dropped_mask(logits, Truncation.of(s)), float("-inf"))


def penalize_repetitions(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """HF's RepetitionPenaltyLogitsProcessor (CTRL, Keskar et al. 2019): a token already in the row
    (seen (N,V) bool) gets logit * penalty if negative, logit / penalty otherwise. (N,V) -> (N,V)."""
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def seen_tokens(ids: Tensor, mask: Tensor, vocab: int) -> Tensor:
    """(N,L) ids, (N,L) bool mask of the real ones -> (N,V+1) bool: the tokens each row holds, and a
    last column that collects the padding (HF's processor also penalizes the pad id of left-padded
    batches; here padding is not a token of the row). A scatter of one value: no host sync, and
    repeated indices all write True, so the result does not depend on their order."""
    seen = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, torch.where(mask, ids, torch.full_like(ids, vocab)), torch.ones_like(mask))


@dataclass
class Shaping:
    """The stateful part of the logit shaping of one `sample` call: min_new_tokens (EOS forbidden
    before it, as HF's MinNewTokensLengthLogitsProcessor) and the repetition penalty (the tokens
    seen so far, prompt included)."""

    eos_id: int
    min_new_tokens: int = 0
    penalty: float = 1.0
    seen: Tensor | None = None  # (N,V+1) bool, with a penalty (`seen_tokens`)

    def __call__(self, logits: Tensor, step: int) -> Tensor:
        """The logits to draw step `step` (0-based) from. (N,V) -> (N,V)."""
        if self.seen is not None:
            logits = penalize_repetitions(logits, self.seen[:, :-1], self.penalty)
        if step < self.min_new_tokens:
            logits = logits.clone()
            logits[:, self.eos_id] = float("-inf")
        return logits

    def add(self, tok: Tensor, live: Tensor) -> None:
        """Record the tokens (N,) just sampled by the live rows (N,) bool."""
        if self.seen is not None:
            where = torch.where(live, tok, torch.full_like(tok, self.seen.shape[1] - 1))  # padding: the last column
            self.seen.scatter_(1, where[:, None], torch.ones_like(live[:, None]))


def shaping(prompt_ids: Tensor, prompt_mask: Tensor, k: int, vocab: int, eos_id: int, s: Sampling) -> Shaping | None:
    """The Shaping of N = B*k rows continuing (B,P) prompts k times each; None when it changes nothing
    (min_new_tokens 0, penalty 1), so the default path is today's, bitwise."""
    if s.min_new_tokens <= 0 and s.repetition_penalty == 1.0:
        return None
    penalty = s.repetition_penalty
    seen = None if penalty == 1.0 else seen_tokens(prompt_ids, prompt_mask, vocab).repeat_interleave(k, dim=0)
    return Shaping(eos_id, s.min_new_tokens, penalty, seen)


class StopStrings:
    """A row ends when the decoded text of its generated tokens (special tokens dropped, as the
    completion's text) contains one of `stops`. Checked on the text, never by re-tokenizing: a stop
    string can end inside a token or span several. The token that completes it is the row's last.
    `after` (min_new_tokens): only a stop string ending past the text of the row's first `after`
    tokens counts (it may start inside it), as vLLM's min_tokens does (its detokenizer searches
    only the text generated after them): text that was held back never ends a row later."""

    def __init__(self, tokenizer, stops: Sequence[str], after: int = 0):
        self.tokenizer, self.stops, self.after = tokenizer, tuple(stops), after

    def __call__(self, rows: list[list[int]]) -> list[bool]:
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        held = [0] * len(rows)  # per row, the length of its first `after` tokens' text
        if self.after:
            heads = self.tokenizer.batch_decode([r[: self.after] for r in rows], skip_special_tokens=True)
            held = [len(h) for h in heads]
        return [
            any(t.find(s, max(0, b - len(s) + 1)) >= 0 for s in self.stops) for t, b in zip(texts, held, strict=True)
        ]

    def hits(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(N,T) ids, (N,T) bool real tokens -> (N,) bool: the rows whose text contains a stop string."""
        found = self([row[m].tolist() for row, m in zip(ids, mask, strict=True)])
        return torch.tensor(found, dtype=torch.bool, device=ids.device)


def off_policy_note(s: Sampling) -> str | None:
    """The one-line note a training run prints once when its samples are not drawn from pi at the
    temperature (None when they are). Each of these shapes the distribution drawn from, while the
    stored log-probs, the KL term and the gradient are the full temperature-scaled distribution's.
    Under s.truncated_logprobs (rl.logprobs_under=truncated) top_p and top_k shape nothing away from the
    trained distribution, which is the truncated one itself (rloo.core.truncation)."""
    truncates = not s.truncated_logprobs
    shaped = [
        f"top_p={s.top_p}" if truncates and s.top_p < 1.0 else "",
        f"top_k={s.top_k}" if truncates and s.top_k > 0 else "",
        f"min_new_tokens={s.min_new_tokens}" if s.min_new_tokens > 0 else "",
        f"repetition_penalty={s.repetition_penalty}" if s.repetition_penalty != 1.0 else "",
    ]
    shaped = [x for x in shaped if x]
    if not shaped:
        return None
    return (
        f"note: {', '.join(shaped)} samples from a shaped distribution, but the log-probs, the KL term and "
        f"the gradient are the full temperature-scaled distribution's (a bias, larger the more it shapes); "
        f"docs/configs.md, 'Sampling settings and the log-probs'"
    )
