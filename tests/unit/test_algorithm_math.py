"""Hand-derived tests for the math added for the compared methods (rloo.core)."""

import math

import pytest
import torch

from rloo.core.advantages import group_normalized, leave_one_out
from rloo.core.estimators import ADVANTAGES, AdvantageInputs
from rloo.core.losses import grpo_loss, sequence_sum_policy_gradient_loss, token_policy_gradient_loss


def leave_one_out_token_kl(scores, kl, mask, beta, k):
    """The registered kl_level=token advantage on given per-token KLs (k1 of logprobs = kl, ref = 0)."""
    n = scores.shape[0]
    ones = torch.ones(n, dtype=torch.bool)
    x = AdvantageInputs(scores, scores, ones, ones, kl, torch.zeros_like(kl), mask, k)
    return ADVANTAGES["leave_one_out_token_kl"](x, {"beta": beta, "kl_estimator": "k1"})


def test_leave_one_out_token_kl_worked_example():
    # k=2, beta=1. scores [1, 3]; per-token KL row0 [0.2, 0.4], row1 [0.6, pad].
    # R0 = 1 - 0.6 = 0.4, R1 = 3 - 0.6 = 2.4 -> b0 = R1 = 2.4, b1 = R0 = 0.4
    # row0 reward-to-go: t0: 1 - (0.2+0.4) = 0.4, t1: 1 - 0.4 = 0.6 -> A0 = [0.4-2.4, 0.6-2.4] = [-2.0, -1.8]
    # row1: t0: 3 - 0.6 = 2.4 -> A1 = [2.4 - 0.4, 0 (padding)] = [2.0, 0]
    scores = torch.tensor([1.0, 3.0], dtype=torch.float64)
    kl = torch.tensor([[0.2, 0.4], [0.6, 99.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    out = leave_one_out_token_kl(scores, kl, mask, beta=1.0, k=2)
    torch.testing.assert_close(out, torch.tensor([[-2.0, -1.8], [2.0, 0.0]], dtype=torch.float64))


def test_leave_one_out_token_kl_first_token_equals_sequence_rloo():
    g = torch.Generator().manual_seed(0)
    scores, kl = torch.randn(6, generator=g, dtype=torch.float64), torch.rand(6, 5, generator=g, dtype=torch.float64)
    mask = torch.arange(5)[None, :] < torch.tensor([5, 3, 1, 4, 2, 5])[:, None]
    out = leave_one_out_token_kl(scores, kl, mask, beta=0.3, k=3)
    seq_r = scores - 0.3 * torch.where(mask, kl, 0).sum(-1)
    torch.testing.assert_close(out[:, 0], leave_one_out(seq_r.view(-1, 3)).view(-1))


def test_token_policy_gradient_loss_on_numbers():
    # mean over the 3 real tokens of A*lp: (1*-1 + 2*-2 + (-1)*-3) / 3 = (-1 - 4 + 3)/3 = -2/3 -> loss 2/3
    lp = torch.tensor([[-1.0, -2.0], [-3.0, -7.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0], [-1.0, 5.0]])
    mask = torch.tensor([[True, True], [True, False]])
    loss, _ = token_policy_gradient_loss(lp, adv, mask)
    assert loss.item() == pytest.approx(2 / 3)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1 / 3, -2 / 3], [1 / 3, 0.0]]))


def test_sequence_sum_loss_equals_eq5_with_constant_advantages():
    # -(1/2) * (A0*(lp00+lp01) + A1*lp10) = -(1/2) * (2*(-3) + (-1)*(-3)) = -(1/2)*(-3) = 1.5
    lp = torch.tensor([[-1.0, -2.0], [-3.0, -7.0]])
    mask = torch.tensor([[True, True], [True, False]])
    loss, _ = sequence_sum_policy_gradient_loss(lp, torch.tensor([[2.0, 2.0], [-1.0, -1.0]]), mask)
    assert loss.item() == pytest.approx(1.5)


def test_grpo_zero_variance_group_leaves_only_the_kl_term():
    # all four scores equal: advantages are exact zeros, so the surrogate is 0 and the loss is beta * k3.
    adv = group_normalized(torch.full((1, 4), 0.7)).view(-1)
    assert torch.equal(adv, torch.zeros(4))
    lp = torch.tensor([[-1.0, -2.0]] * 4)
    ref = lp - 0.5  # log(ref/pi) = -0.5 on every token: k3 = e^-0.5 - 1 + 0.5
    mask = torch.ones(4, 2, dtype=torch.bool)
    loss, stats = grpo_loss(lp, lp, ref, adv, mask, clip_eps=0.2, beta=0.1)
    k3 = math.exp(-0.5) - 1 + 0.5
    assert not torch.isnan(loss)
    assert loss.item() == pytest.approx(0.1 * k3, rel=1e-5)
    assert stats["loss/kl"].item() == pytest.approx(k3, rel=1e-5)


def test_whole_groups_order():
    from rloo.algorithms.base import whole_groups_order

    rows = torch.tensor([5, 0, 4, 1])  # groups 0 and 2 of k=2, shuffled
    order = whole_groups_order(rows, 2)
    assert order is not None and rows[order].tolist() == [0, 1, 4, 5]
    assert whole_groups_order(torch.tensor([3, 1, 2, 0, 4, 5]), 3) is not None
    assert whole_groups_order(torch.tensor([1, 2]), 2) is None  # two halves of different groups
    assert whole_groups_order(torch.tensor([0, 1, 2]), 2) is None  # not a multiple of k
    assert whole_groups_order(torch.tensor([0, 0]), 2) is None  # a repeated row
    assert whole_groups_order(torch.tensor([0, 1]), 1) is None  # k=1: nothing to share
