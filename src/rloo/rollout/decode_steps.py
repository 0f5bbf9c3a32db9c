"""The decode loop of `rloo.rollout.sampler.sample_tokens`, one token per step: how a token is drawn
(`Draw`), where rows end (`Ends`), the one-token passes against the KV cache (`Decoder`), and the
loop itself (`decode`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rloo.config import Sampling
from rloo.modeling.forward import lm_logits
from rloo.rollout.decoding import StopStrings
from rloo.rollout.draw import _next_token, uniforms


def row_noise(rows: tuple[int, int] | None, max_new_tokens: int, n: int, generator, device) -> Tensor | None:
    """`rows=(offset, total)`: the n rows sampled here are rows offset..offset+n-1 of a global batch
    of `total` rows sampled by several processes (rloo.runtime.distributed). Every process draws
    the same (max_new_tokens, total) uniforms and keeps its own columns (max_new_tokens, n) for
    `_inverse_cdf`, so the tokens do not depend on how the batch is split over processes."""
    if rows is None:
        return None
    offset, total = rows
    return uniforms((max_new_tokens, total), generator, "cpu")[:, offset : offset + n].to(device)


@dataclass
class Draw:
    """How each token is drawn from its (N, V) logits (`_next_token` with the settings `s`); `shape`: the
    decoding settings' logit shaping, None without them (rloo.rollout.decoding.shaping)."""

    s: Sampling
    generator: torch.Generator | None
    noise: Tensor | None  # (max_new_tokens, N) uniforms of the rows (`row_noise`), or None
    shape: Any

    def __call__(self, logits: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """Token t of every row (N,) and its log-prob (N,)."""
        u = None if self.noise is None else self.noise[t]
        shaped = None if self.shape is None else self.shape(logits, t)
        return _next_token(logits, self.s, self.generator, u, shaped)


@dataclass
class Ends:
    """Where rows end: at EOS, or after min_new_tokens tokens at a stop string ending past their
    text (`stop.after`, vLLM's rule); `all_done(done)` decides when every row has ended (FSDP:
    processes stop together), else done.all()."""

    eos_id: int
    min_new_tokens: int
    stop: StopStrings | None
    all_done: Any

    def after(self, tok: Tensor, ids: list[Tensor], done: Tensor) -> tuple[Tensor, bool]:
        """(N,) bool done after token `tok` (N,), the last of `ids`; and whether every row is."""
        done = done | (tok == self.eos_id)
        if self.stop is not None and len(ids) > self.min_new_tokens:
            done = done | _stopped(self.stop, ids, done)
        return done, self.all_done(done) if self.all_done is not None else bool(done.all())


@dataclass
class Decoder:
    """The model's one-token passes against the KV cache: the extra inputs (`kw`: the cache, and
    grouped decoding's), the (N, P+t) attention mask and the (N, 1) next positions."""

    model: Any
    kw: dict
    mask: Tensor
    next_pos: Tensor

    def next_logits(self, tok: Tensor) -> Tensor:
        """(N, V) logits of the token after `tok` (N,)."""
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        step = {"input_ids": tok[:, None], "attention_mask": self.mask, "position_ids": self.next_pos}
        logits = lm_logits(self.model, 1, **step, use_cache=True, **self.kw)[0][:, -1]
        self.next_pos = self.next_pos + 1
        return logits


def _stopped(stop: StopStrings, ids: list[Tensor], done: Tensor) -> Tensor:
    """(N,) bool: the live rows (not `done`) whose generated text now contains a stop string; a live
    row's tokens are all real."""
    out = torch.zeros_like(done)
    live = (~done).nonzero(as_tuple=True)[0]
    if len(live):
        found = stop(torch.stack(ids, 1)[live].tolist())
        out[live] = torch.tensor(found, dtype=torch.bool, device=done.device)
    return out


def decode(logits: Tensor, dec: Decoder, draw: Draw, ends: Ends, done: Tensor, pad_id: int, max_new_tokens: int):
    """Tokens from the first token's (N, V) logits until every row has ended (`done` (N,) bool:
    none yet) or max_new_tokens: ids, mask, logprobs (N, T); a row's tokens after its end are
    pad_id, masked, with log-prob 0."""
    ids, masks, lps = [], [], []
    for _ in range(max_new_tokens):
        tok, lp = draw(logits, len(ids))
        tok = tok.masked_fill(done, pad_id)
        ids.append(tok)
        masks.append(~done)
        lps.append(lp.masked_fill(done, 0.0))
        if draw.shape is not None:
            draw.shape.add(tok, ~done)
        done, finished = ends.after(tok, ids, done)
        if finished or len(ids) == max_new_tokens:  # the last token's forward would be wasted
            break
        logits = dec.next_logits(tok)
    return torch.stack(ids, 1), torch.stack(masks, 1), torch.stack(lps, 1)
