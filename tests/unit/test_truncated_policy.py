"""rl.logprobs_under=truncated is unbiased for the policy that is sampled (docs/async.md, "Top-k and
top-p: the truncated policy"), by exact enumeration on a tiny autoregressive model.

The model: vocabulary V = 5, completions of length 2, logits z_1 = a (V,) for the first token and
z_2 = W[y_1] (V,) for the second (a bigram table: theta = (a, W), 30 numbers), temperature 0.8. The
sampler draws y_t from pi_K(.|y_<t) = softmax of the top-k / top-p filtered z_t / T (the sampler's
own filters, rloo.rollout.decoding). The objective is the truncated policy's

    J(theta) = E_{y ~ pi_K}[ r(y) - beta log(pi_K(y) / pi_ref(y)) ],   pi_ref: the full softmax of a fixed table,

computed exactly as a sum over the 25 completions. RLOO's estimator with k = 2 samples (eq. 1, 4, 5
through rloo's own functions: shaped_reward, leave_one_out, policy_gradient_loss, with the sampler's
stored log-probs in the KL and the trainer's token_logprobs in the loss) has the expectation
sum over the 625 pairs of P(pair) * its gradient: it must equal grad J (by autograd of the exact sum,
and by central differences, which do not assume that the kept set is locally constant). With the
full distribution's log-probs (logprobs_under=full, the paper's) it must not: that is the bias.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from rloo.config import Sampling
from rloo.core.advantages import leave_one_out
from rloo.core.kl import shaped_reward
from rloo.core.logprobs import sequence_logprobs, token_logprobs
from rloo.core.losses import policy_gradient_loss
from rloo.core.truncation import Truncation
from rloo.rollout.decoding import truncate
from rloo.rollout.draw import _next_token
from tolerance import ELEMENTWISE, tolerance

V, L, TEMP, BETA, K = 5, 2, 0.8, 0.1, 2
F64 = torch.float64
COMPLETIONS = [torch.tensor(y) for y in itertools.product(range(V), repeat=L)]
REWARD = {tuple(y.tolist()): float(r) for y, r in zip(COMPLETIONS, torch.linspace(-1, 2, V**L).roll(7), strict=True)}


def _table(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, generator=g, dtype=F64) * 0.7, torch.randn(V, V, generator=g, dtype=F64) * 0.7


def _logits(theta, ys: torch.Tensor) -> torch.Tensor:
    """(n, L) completions -> (n, L, V) logits of the bigram model."""
    a, w = theta
    return torch.stack([a.expand(len(ys), V), w[ys[:, 0]]], dim=1)


def _sampling_logprobs(logits: torch.Tensor, trunc: Truncation) -> torch.Tensor:
    """log of the sampler's distribution (rloo.rollout.draw: z / T, top_k then top_p (`truncate`),
    softmax), (..., V) -> (..., V)."""
    return truncate(logits / TEMP, Sampling(1, 1, top_p=trunc.top_p, top_k=trunc.top_k)).log_softmax(-1)


def _sequence_logprob(theta, ys, trunc: Truncation) -> torch.Tensor:
    """log P_sample(y) (n,) of completions (n, L)."""
    lp = _sampling_logprobs(_logits(theta, ys), trunc)
    return lp.gather(-1, ys[..., None]).squeeze(-1).sum(-1)


def objective(theta, ref, trunc: Truncation) -> torch.Tensor:
    """J(theta): the exact expectation over the 25 completions (those of probability 0 count 0)."""
    ys = torch.stack(COMPLETIONS)
    log_p = _sequence_logprob(theta, ys, trunc)
    kept = log_p > float("-inf")
    log_p = log_p.masked_fill(~kept, 0.0)  # before any arithmetic: a where after it would pass NaN gradients
    log_ref = (_logits(ref, ys) / TEMP).log_softmax(-1).gather(-1, ys[..., None]).squeeze(-1).sum(-1)
    r = torch.tensor([REWARD[tuple(y.tolist())] for y in ys], dtype=F64)
    return (kept * log_p.exp() * (r - BETA * (log_p - log_ref))).sum()


def estimator_expectation(theta, ref, trunc: Truncation, truncated: bool) -> list[torch.Tensor]:
    """E over k = 2 samples from the sampler of rloo's RLOO gradient (of -loss), by enumeration.
    truncated: the trainer's log-probs and the KL's are pi_K's (logprobs_under=truncated); else the
    full softmax's (logprobs_under=full)."""
    ys = torch.stack(COMPLETIONS)
    with torch.no_grad():
        p_sample = _sequence_logprob(theta, ys, trunc).exp()
    train_trunc = trunc if truncated else None
    total = torch.zeros((), dtype=F64)
    for i, j in itertools.product(range(len(ys)), repeat=2):
        weight = p_sample[i] * p_sample[j]
        if weight == 0:
            continue
        pair = ys[[i, j]]
        lp = token_logprobs(_logits(theta, pair), pair, temperature=TEMP, truncation=train_trunc)  # (2, L)
        with torch.no_grad():
            stored = lp.detach()  # the sampler's stored log-probs: checked equal in test_sampler_stores_them
            ref_lp = token_logprobs(_logits(ref, pair), pair, temperature=TEMP)
        mask = torch.ones(2, L, dtype=torch.bool)
        scores = torch.tensor([REWARD[tuple(y.tolist())] for y in pair], dtype=F64)
        rewards, _ = shaped_reward(scores, stored, ref_lp, mask, BETA)
        adv = leave_one_out(rewards.view(-1, K)).view(-1)
        loss, _ = policy_gradient_loss(sequence_logprobs(lp, mask), adv)
        total = total + weight * loss
    return [-g for g in torch.autograd.grad(total, theta)]


TRUNCATIONS = [Truncation(top_k=2), Truncation(top_p=0.7), Truncation(top_k=3, top_p=0.8)]


@pytest.mark.parametrize("trunc", TRUNCATIONS, ids=str)
def test_expected_estimator_is_the_truncated_policys_gradient(trunc):
    theta, ref = [t.requires_grad_() for t in _table(0)], _table(1)
    # at every position the filters cut some tokens and keep at least two, or pi_K = pi (nothing to
    # correct) or a point mass (every leave-one-out advantage 0) and the test proves nothing
    kept = (_sampling_logprobs(_logits(theta, torch.stack(COMPLETIONS)), trunc).exp() > 0).sum(-1)
    assert ((kept >= 2) & (kept < V)).all(), kept
    true = torch.autograd.grad(objective(theta, ref, trunc), theta)
    expected = estimator_expectation(theta, ref, trunc, truncated=True)
    scale = max(float(g.abs().max()) for g in true)
    # float64, a sum of 625 pairs' gradients: 625 * eps * scale bounds the reordering (ELEMENTWISE x 2^7)
    tol = tolerance(None, ELEMENTWISE * 2**7, dtype=F64, scale=scale)
    for e, t in zip(expected, true, strict=True):
        torch.testing.assert_close(e, t, rtol=0, atol=tol)
    # central differences on J: the true derivative, without assuming the kept set is locally constant;
    # error ~ eps J / h + h^2 J''' / 6 ~ 1e-10 at h = 1e-5 (|J|, |J'''| of order 1-10): 2^20 eps
    h, flat = 1e-5, [(n, idx) for n, t in enumerate(theta) for idx in itertools.product(*map(range, t.shape))]
    with torch.no_grad():
        for n, idx in flat:
            plus, minus = [t.clone() for t in theta], [t.clone() for t in theta]
            plus[n][idx] += h
            minus[n][idx] -= h
            fd = (objective(plus, ref, trunc) - objective(minus, ref, trunc)) / (2 * h)
            assert abs(float(fd) - float(expected[n][idx])) <= tolerance(None, 2**20, dtype=F64, scale=10 * scale)
    # the paper's full-distribution log-probs: biased for this sampler, far beyond the tolerance
    full = estimator_expectation(theta, ref, trunc, truncated=False)
    assert max(float((f - t).abs().max()) for f, t in zip(full, true, strict=True)) > 1e3 * tol


@pytest.mark.parametrize("trunc", TRUNCATIONS, ids=str)
def test_sampler_stores_the_truncated_logprobs(trunc):
    """_next_token with truncated_logprobs returns log pi_K of the token it drew, the quantity the
    trainer's token_logprobs(truncation=...) recomputes; without it, the full softmax's (unchanged)."""
    a, w = _table(0)
    logits = torch.cat([a[None], w]).float()  # (6, V): every position of the model
    want = _sampling_logprobs(logits.double(), trunc)
    for u in torch.linspace(0.01, 0.99, 25):
        us = torch.full((len(logits),), float(u))
        s = Sampling(1, 1, TEMP, top_p=trunc.top_p, top_k=trunc.top_k)
        tok, lp = _next_token(logits, s.replace(truncated_logprobs=True), None, us)
        picked = want.gather(-1, tok[:, None]).squeeze(-1)
        assert torch.isfinite(picked).all()  # drawn from the kept set
        torch.testing.assert_close(lp.double(), picked, rtol=0, atol=tolerance(picked, ELEMENTWISE))
        recomputed = token_logprobs(logits[None], tok[None], temperature=TEMP, truncation=trunc)[0]
        torch.testing.assert_close(recomputed, lp, rtol=0, atol=tolerance(lp, ELEMENTWISE))
        _, full = _next_token(logits, s, None, us)
        torch.testing.assert_close(full, (logits / TEMP).log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1))
