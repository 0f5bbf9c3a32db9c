"""Token log-probabilities and masking helpers.

Notation: N completions, T completion length, V vocabulary.
Masks are bool tensors where True marks a real token that counts
(a completion token up to and including its EOS); False marks padding.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from .truncation import Truncation, truncated_logits


def _check_same_shape(**tensors: Tensor) -> None:
    """Raise ValueError unless every named tensor has the same shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"shapes must match, got {listed}")


def _check_mask(x: Tensor, mask: Tensor) -> None:
    # A float 0/1 mask would silently work with multiplication but not with
    # torch.where or indexing; insisting on bool catches that mix-up early.
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = real token), got dtype {mask.dtype}")
    _check_same_shape(x=x, mask=mask)


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over positions where ``mask`` is True (a real token).

    x, mask: same shape; mask bool. dim=None sums everything (0-d result).
    """
    _check_mask(x, mask)
    # where, not multiplication: -inf or NaN at padded positions must not leak (0 * inf = NaN).
    kept = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_difference(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """a - b at real tokens, 0 where ``mask`` is False: a log-ratio safe to exponentiate.

    a, b, mask: same shape -> same shape. Masking before the exp, not after: a log-prob of -1e4
    at a padded or observation position would make exp(+1e4) = inf there, and the gradient of a
    masked sum 0 * inf = NaN (the masked forward value alone stays finite).
    """
    _check_mask(a, mask)
    return torch.where(mask, a - b, torch.zeros((), dtype=a.dtype, device=a.device))


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is True (a real token).

    x, mask: same shape; mask bool. A slice with no real tokens has mean 0, not NaN.
    """
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def sequence_logprobs(token_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log pi(y|x) = sum_t log pi(y_t | x, y_<t) over real tokens.

    token_logprobs: (N, T), mask: (N, T) bool, True = real token -> (N,).
    """
    return masked_sum(token_logprobs, mask, dim=-1)


def token_logprobs(
    logits: Tensor,
    tokens: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    truncation: Truncation | None = None,
) -> Tensor:
    """log softmax(logits / temperature) gathered at ``tokens``.

    logits: (N, T, V), tokens: (N, T) long -> (N, T).

    Computed as ``logit[token] - logsumexp(logits)`` so no (N, T, V) log-softmax
    copy is made. With ``chunk_size`` the N*T positions are processed that many
    at a time, bounding the temporary (chunk_size, V) buffers (a temperature
    division or a float32 upcast). Under autograd, logsumexp keeps its input for
    the backward pass, so the bound is strict only under ``torch.no_grad()``.
    Half-precision logits are upcast to float32 per chunk, since logsumexp in
    bf16 loses about two decimal digits; the result is then float32.
    truncation: log pi_K of the top-k/top-p truncated, renormalised distribution instead
    (rloo.core.truncation; rl.logprobs_under=truncated).
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (N, T, V), got shape {tuple(logits.shape)}")
    if tuple(tokens.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"tokens must be (N, T) = {tuple(logits.shape[:2])}, got {tuple(tokens.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")

    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1, 1).long()
    step = chunk_size or max(flat_logits.shape[0], 1)
    pieces = []
    for start in range(0, flat_logits.shape[0], step):
        chunk = flat_logits[start : start + step]
        if chunk.dtype in (torch.float16, torch.bfloat16):
            chunk = chunk.float()
        if temperature != 1.0:  # skip the division (a full copy) in the common case
            chunk = chunk / temperature
        if truncation is not None:
            chunk = truncated_logits(chunk, flat_tokens[start : start + step, 0], truncation)
        picked = chunk.gather(-1, flat_tokens[start : start + step]).squeeze(-1)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    if not pieces:  # N*T == 0
        out_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
        return logits.new_zeros(tokens.shape, dtype=out_dtype)
    return torch.cat(pieces).view(tokens.shape)


def completion_mask(tokens: Tensor, eos_id: int, pad_id: int | None = None) -> Tensor:
    """Mask of real completion tokens: True up to and including the first EOS.

    tokens: (N, T) -> bool (N, T), True = real token. Everything after the first
    EOS is False. A sequence without EOS (truncated) is True everywhere, except
    at ``pad_id`` tokens when given. When pad_id == eos_id the first EOS still counts.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (N, T), got shape {tuple(tokens.shape)}")
    is_eos = tokens == eos_id
    # Number of EOS strictly before each position; zero means "still inside the completion".
    eos_before = is_eos.long().cumsum(dim=-1) - is_eos.long()
    mask = eos_before == 0
    if pad_id is not None and pad_id != eos_id:
        mask = mask & (tokens != pad_id)
    return mask


def fp32_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x W^T + b in float32, with autocast off where it is on. x (..., H), weight (V, H), bias (V,) -> (..., V).

    The LM head of every log-prob pass (issue 34): under bf16 autocast its product would round the
    logits to 8 bits before the fp32 log-softmax (so the sampler's log-probs, a training pass's and
    a reference's would differ by bf16 rounding: step-0 KL != 0, first PPO ratio != 1). On fp32
    tensors without autocast this is exactly F.linear (the .float() calls return their input)."""
    on = torch.is_autocast_enabled(x.device.type)
    with torch.autocast(x.device.type, enabled=False) if on else contextlib.nullcontext():
        return torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())


class _HeadLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b)/temperature at the target tokens, `chunk` positions at a time, with
    no (n, V) tensor kept: the backward pass recomputes each chunk's logits (one extra LM-head
    matmul) and uses d lp_i / d z_ij = (1[j = y_i] - softmax_ij) / temperature. Both passes compute in
    float32 (`fp32_linear`, autocast off), the gradients are returned in the inputs' dtypes."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk, truncation):
        out = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk):
            z = fp32_linear(hidden[s : s + chunk], weight, bias)
            if temperature != 1.0:
                z = z.div_(temperature)  # in place: a chunk's logits are the largest tensors here
            if truncation is not None:  # pi_K: -inf outside the kept set (recomputed alike in backward)
                z = truncated_logits(z, tokens[s : s + chunk], truncation)
            lse[s : s + chunk] = z.logsumexp(-1)
            out[s : s + chunk] = z.gather(-1, tokens[s : s + chunk, None]).squeeze(-1) - lse[s : s + chunk]
        ctx.save_for_backward(hidden, weight, bias, tokens, lse)
        ctx.temperature, ctx.chunk, ctx.truncation = temperature, chunk, truncation
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, tokens, lse = ctx.saved_tensors
        t, chunk, trunc = ctx.temperature, ctx.chunk, ctx.truncation
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        on = torch.is_autocast_enabled(hidden.device.type)
        with torch.autocast(hidden.device.type, enabled=False) if on else contextlib.nullcontext():
            w = weight.float()
            for s in range(0, hidden.shape[0], chunk):
                h, g = hidden[s : s + chunk].float(), grad[s : s + chunk]
                z = fp32_linear(h, w, bias).div_(t)
                if trunc is not None:  # softmax of pi_K: 0 outside the kept set
                    z = truncated_logits(z, tokens[s : s + chunk], trunc)
                dz = z.sub_(lse[s : s + chunk, None]).exp_().mul_(-g[:, None])  # -g * softmax, in place
                dz.scatter_add_(-1, tokens[s : s + chunk, None], g[:, None])  # + g at the target
                dz = dz.div_(t)
                if grad_h is not None:
                    grad_h[s : s + chunk] = dz @ w
                if grad_w is not None:
                    grad_w.addmm_(dz.t(), h)
                if grad_b is not None:
                    grad_b += dz.sum(0)
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def head_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tokens: Tensor,
    temperature: float = 1.0,
    chunk: int = 1024,
    truncation: Truncation | None = None,
) -> Tensor:
    """`token_logprobs(hidden @ weight.T + bias, tokens)` without ever holding the (n, V) logits.

    hidden (..., H), weight (V, H), bias (V,) or None, tokens (...) long -> (...) float32.
    Forward and backward run `chunk` positions at a time, so memory is O(chunk * V) instead of
    O(n * V) (several GB for a 150k-token vocabulary and a few thousand completion tokens); the
    price is one more LM-head matmul in the backward pass (the logits are recomputed, not kept).
    truncation: as `token_logprobs`'s (the kept set recomputed with the logits in backward).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if tuple(tokens.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"tokens must have shape {tuple(hidden.shape[:-1])}, got {tuple(tokens.shape)}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    args = (tokens.reshape(-1).long(), float(temperature), max(int(chunk), 1), truncation)
    lp = _HeadLogprobs.apply(flat, weight, bias, *args)
    return lp.view(tokens.shape)
