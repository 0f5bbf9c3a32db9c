"""One decode step's draw from (N, V) logits: the noise, the draw (exponential race or inverse CDF
from given uniforms) and greedy decoding; the logits' shaping is rloo.rollout.decoding's."""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.config import Sampling
from rloo.rollout.decoding import logprob_temperature, truncate


def uniforms(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | str) -> Tensor:
    """U(0,1) noise of `shape` for tensors on `device`, drawn where the generator lives and moved.

    The one place that decides where sampling noise is drawn: the loop's generator is a CPU one
    (its state is what checkpoints save, rloo.runtime.checkpoint.rng), and CUDA refuses to draw a CUDA tensor
    with it ("Expected a 'cuda' device type for generator"). Without a generator the noise is
    drawn on `device` itself, from that device's default generator."""
    where = generator.device if generator is not None else torch.device(device)
    return torch.rand(shape, generator=generator, device=where).to(device)


def _draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row with P(i) = probs[i]: the exponential race argmax_i probs_i / E_i, E_i ~ Exp(1)
    (the Gumbel-max trick without logs). The same distribution as torch.multinomial, which on a
    CPU costs ~20 ms for a (32, 8192) batch; this is a few elementwise passes.

    When the generator is on another device than `probs` (a CPU generator, a model on a GPU), one
    uniform per row is drawn where the generator lives (`uniforms`) and the token picked by inverse
    CDF: the same distribution, N numbers moved per step instead of N x V."""
    if generator is not None and generator.device.type != probs.device.type:
        return _inverse_cdf(probs, uniforms((probs.shape[0],), generator, probs.device))
    race = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / race).argmax(-1)


def _inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """One token per row from uniforms u (N,): the first index whose cumulative mass exceeds
    u * total. Zero-probability tokens are never picked (their cumulative mass does not grow).
    One uniform per row (not one per vocabulary entry as in `_draw`), so processes can draw the
    noise of a whole global batch cheaply and each use their rows (see `sample(rows=...)`)."""
    cdf = probs.cumsum(-1)
    # select/unsqueeze rather than indexing: tests/unit/test_device_placement.py runs this on fake CUDA tensors
    total = cdf.select(-1, cdf.shape[-1] - 1)
    tok = torch.searchsorted(cdf, (u * total).unsqueeze(-1).to(cdf.dtype), right=True).squeeze(-1)
    return tok.clamp(max=probs.shape[-1] - 1)


def _next_token(
    logits: Tensor, s: Sampling, generator, u: Tensor | None, shaped: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One decode step's draw with settings `s`. logits (N,V) -> token (N,), its log-prob (N,) under the
    temperature-scaled distribution of the raw logits (see `sample`); drawn from `shaped` (the logits after
    the repetition penalty and min_new_tokens, rloo.rollout.decoding.Shaping) when given, then top-k and
    top-p filtered (`truncate`); from uniforms u (N,) when given, else the exponential race. Temperature 0:
    the argmax (the first of tied maxima), its log-prob at temperature 1 (`logprob_temperature`).
    s.truncated_logprobs: the log-prob under the top-k/top-p truncated distribution drawn from instead
    (rl.logprobs_under; the config refuses it with a shaping)."""
    scaled = logits / logprob_temperature(s.temperature)
    source = logits if shaped is None else shaped
    if s.temperature == 0:
        tok = source.argmax(-1)
    else:
        warped = truncate(scaled if shaped is None else shaped / s.temperature, s)
        probs = warped.softmax(-1)
        tok = _draw(probs, generator) if u is None else _inverse_cdf(probs, u)
        if s.truncated_logprobs:
            scaled = warped
    return tok, scaled.log_softmax(-1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
