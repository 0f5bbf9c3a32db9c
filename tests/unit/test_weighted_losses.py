"""Eq. A3 of docs/async.md in the clipped regime: grpo_loss / dr_grpo_loss with importance weights w,
and ppo_clip_loss with `weigh`'s w A, equal w times each token's own term, value and gradient, when
the ratio to the proximal policy is away from 1 (later minibatches and epochs), float64 by hand."""

from __future__ import annotations

import pytest
import torch

from rloo.core.losses import dr_grpo_loss, grpo_loss, ppo_clip_loss, weigh

EPS, BETA, L = 0.2, 0.1, 6


def _batch():
    g = torch.Generator().manual_seed(0)
    n, t = 5, 6
    lp = (-torch.rand(n, t, generator=g, dtype=torch.float64) * 3).requires_grad_()
    old = lp.detach() + 0.5 * torch.randn(n, t, generator=g, dtype=torch.float64)  # ratios inside and outside 1 +- eps
    ref = lp.detach() + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 4:], mask[3, 2:] = False, False
    w = torch.rand(n, t, generator=g, dtype=torch.float64) * 2
    w[2] = 0.0  # a masked-out sequence (mis)
    return lp, old, ref, adv, mask, w


def _terms(lp, old, ref, adv, w, kl: bool):
    r = torch.exp(lp - old)
    a = adv[:, None].expand_as(lp)
    out = -torch.minimum(r * a, r.clamp(1 - EPS, 1 + EPS) * a)
    if kl:
        d = ref - lp
        out = out + BETA * (torch.expm1(d) - d)
    return w * out


@pytest.mark.parametrize("which", ["grpo", "dr_grpo", "ppo"])
def test_weighted_surrogate_is_w_times_each_tokens_term(which):
    lp, old, ref, adv, mask, w = _batch()
    r = torch.exp(lp.detach() - old)
    assert ((r - 1).abs() > EPS).any() and ((r - 1).abs() < EPS).any()  # both regimes
    if which == "grpo":
        loss, _ = grpo_loss(lp, old, ref, adv, mask, EPS, BETA, w)
        expected = _terms(lp, old, ref, adv, w, kl=True)[mask].sum() / mask.sum()
    elif which == "dr_grpo":
        loss, _ = dr_grpo_loss(lp, old, ref, adv, mask, EPS, BETA, L, w)
        expected = _terms(lp, old, ref, adv, w, kl=True)[mask].sum() / (lp.shape[0] * L)
    else:
        loss, _ = ppo_clip_loss(lp, old, weigh(adv, w), mask, EPS)
        expected = _terms(lp, old, ref, adv, w, kl=False)[mask].sum() / mask.sum()
    (g,) = torch.autograd.grad(loss, lp)
    (g_expected,) = torch.autograd.grad(expected, lp)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(g, g_expected)


def test_weight_one_is_the_unweighted_loss():
    lp, old, ref, adv, mask, _ = _batch()
    assert weigh(adv, None) is adv  # no weights: the on-policy code's tensors, untouched
    ones = torch.ones_like(lp)
    for weighted, plain in [
        (grpo_loss(lp, old, ref, adv, mask, EPS, BETA, ones), grpo_loss(lp, old, ref, adv, mask, EPS, BETA)),
        (
            dr_grpo_loss(lp, old, ref, adv, mask, EPS, BETA, L, ones),
            dr_grpo_loss(lp, old, ref, adv, mask, EPS, BETA, L),
        ),
    ]:
        torch.testing.assert_close(weighted[0], plain[0])
