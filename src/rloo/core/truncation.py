"""The top-k / top-p truncated policy (rl.logprobs_under=truncated; docs/configs.md, "Sampling settings
and the log-probs"; docs/async.md derives the gradient): the distribution the sampler draws from,

    pi_K(v|s) = pi(v|s) 1{v in K(s)} / sum_{u in K(s)} pi(u|s),    pi = softmax(z / T),

K(s) the tokens top_k and then top_p keep of the temperature-scaled logits z / T (Hugging Face's
order: top-k first, top-p on the top-k-renormalised distribution). K is a step function of the
weights, constant almost everywhere, so grad log pi_K(y|s) = grad log pi(y|s) - grad log sum_{u in K}
pi(u|s) with K held fixed: what autograd gives for log_softmax of the logits with -inf outside K.

Shapes: logits (..., V) already divided by the temperature; masks bool, True = kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


class Knobs(Protocol):
    """What holds the draw's truncation settings: a Sampling, or a config's RL section."""

    @property
    def top_k(self) -> int: ...

    @property
    def top_p(self) -> float: ...


@dataclass(frozen=True)
class Truncation:
    """The sampler's truncation: top_k (0: none) and top_p (1: none)."""

    top_k: int = 0
    top_p: float = 1.0

    @classmethod
    def of(cls, knobs: Knobs) -> Truncation:
        """The truncation `knobs` (a Sampling or an RL section) sample under."""
        return cls(knobs.top_k, knobs.top_p)


def top_k_dropped(logits: Tensor, top_k: int) -> Tensor:
    """What Hugging Face's TopKLogitsWarper drops: logit < the k-th largest (ties at the boundary
    stay). (..., V) -> (..., V) bool, True = dropped."""
    kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]
    return logits < kth


def top_p_dropped(logits: Tensor, top_p: float) -> Tensor:
    """What top_p drops: a token whose preceding mass (in descending order) already reaches top_p;
    the top token always stays. (..., V) -> (..., V) bool, True = dropped (-inf logits, dropped
    before, may read False: their probability is 0 either way, and `dropped_mask` takes the union)."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p
    return torch.zeros_like(drop).scatter_(-1, idx, drop)


def dropped_mask(logits: Tensor, trunc: Truncation) -> Tensor:
    """Outside K(s): what top_k drops, then what top_p drops of the top-k-truncated logits; K(s) is
    its complement. Written as the dropped set because both the sampler and pi_K fill it with -inf.
    (..., V) -> (..., V) bool, True = dropped."""
    # logical_or rather than |: the sampler's step runs this on fake CUDA tensors in
    # tests/unit/test_device_placement.py, which lack some bool bitwise kernels (the same values)
    if trunc.top_k == 0:
        dropped = torch.zeros_like(logits, dtype=torch.bool)
    else:
        dropped = top_k_dropped(logits, trunc.top_k)
        if trunc.top_p < 1.0:  # what top_p reads (the sampler's step skips it when nothing does)
            logits = logits.masked_fill(dropped, float("-inf"))
    if trunc.top_p < 1.0:
        dropped = dropped.logical_or(top_p_dropped(logits, trunc.top_p))
    return dropped


def truncated_logits(logits: Tensor, tokens: Tensor, trunc: Truncation) -> Tensor:
    """The logits of pi_K: -inf outside K(s), differentiable inside (the mask is computed without
    gradient). The target token `tokens` (...,) always stays in K: at lag 0 it was drawn from K, so
    this changes nothing unless the recomputed logits put it outside by rounding (a boundary tie),
    where a -inf log-prob would otherwise end the run. (..., V), (...,) -> (..., V)."""
    with torch.no_grad():
        dropped = dropped_mask(logits.detach(), trunc)
        dropped.scatter_(-1, tokens.unsqueeze(-1).long(), False)
    return logits.masked_fill(dropped, float("-inf"))
